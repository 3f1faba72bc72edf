"""SSH connections to login nodes, kept and shared by every command of this controller.

A launch runs a dozen Slurm commands (sbatch, squeue until the allocation runs, scontrol) and a
terminate a few more; a connection each would log into the login node each time, which its
admins see as a flood and which costs a handshake per command. So one connection per login node
and credential is opened on the first command, every later command (from any thread) opens a
channel on it, and one that dropped is opened again on the next command.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpulayer.cloud import SshSession

ConnectionKey = tuple[str, ...]
"""What a kept connection is for: host, port, user, key file, pinned host key, key store."""


@dataclass
class _Kept:
    lock: threading.Lock = field(default_factory=threading.Lock)
    session: SshSession | None = None


@dataclass(frozen=True)
class Ran:
    exit_code: int
    stdout: str
    stderr: str


class LoginConnections:
    """The kept connections, by :data:`ConnectionKey`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[ConnectionKey, _Kept] = {}

    def run(
        self,
        key: ConnectionKey,
        connect: Callable[[], SshSession],
        command: str,
        *,
        timeout: float,
        once: bool = False,
    ) -> Ran:
        """``command`` on the kept connection for ``key`` (``connect`` opens one when there is
        none or it dropped). A command that fails on a connection kept from before is tried
        once more on a new one, unless ``once`` (a command that must not run twice, as
        sbatch: it may have gone through before the connection dropped). Raises SshError."""
        from gpulayer.cloud import SshError

        session, fresh = self._session(key, connect)
        try:
            result = session.run(command, timeout=timeout)
        except SshError:
            if session.connected:
                raise  # the command failed (too slow, say); the connection is fine
            self._drop(key, session)
            if fresh or once:
                raise
            session, _ = self._session(key, connect)
            try:
                result = session.run(command, timeout=timeout)
            except SshError:
                if not session.connected:
                    self._drop(key, session)
                raise
        return Ran(result.exit_code, result.stdout, result.stderr)

    def _session(
        self, key: ConnectionKey, connect: Callable[[], SshSession]
    ) -> tuple[SshSession, bool]:
        """The live session for ``key`` and whether it was opened by this call."""
        with self._lock:
            kept = self._kept.setdefault(key, _Kept())
        # One connect per key at a time: commands that arrive meanwhile wait and share it.
        with kept.lock:
            if kept.session is not None and kept.session.connected:
                return kept.session, False
            if kept.session is not None:
                kept.session.close()
                kept.session = None
            kept.session = connect()
            return kept.session, True

    def _drop(self, key: ConnectionKey, session: SshSession) -> None:
        with self._lock:
            kept = self._kept.get(key)
        if kept is None:
            return
        with kept.lock:
            if kept.session is session:
                kept.session = None
        session.close()

    def close(self) -> None:
        """Close every kept connection (the next command opens its own again)."""
        with self._lock:
            kept = list(self._kept.values())
            self._kept.clear()
        for entry in kept:
            with entry.lock:
                session, entry.session = entry.session, None
            if session is not None:
                session.close()


CONNECTIONS = LoginConnections()
atexit.register(CONNECTIONS.close)


def close_login_connections() -> None:
    """Close the connections this process keeps to login nodes."""
    CONNECTIONS.close()
