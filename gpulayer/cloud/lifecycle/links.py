"""The live SSH link to each instance that runs a worker: its session and reverse tunnel.

A link lives in memory only; what it needs to be reopened lies on disk and in the store (the
instance's key file, its pinned host key, the tunnel's port on the host), so a restarted
controller reopens the tunnel on the same port and the worker there, which kept retrying,
reaches the control plane again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpulayer.ssh.session import SshSession
    from gpulayer.ssh.target import SshTarget
    from gpulayer.ssh.tunnel import ReverseTunnel

log = logging.getLogger("gpulayer.lifecycle")


@dataclass
class Link:
    session: SshSession
    tunnel: ReverseTunnel
    install_dir: str

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.tunnel.close()
        with contextlib.suppress(Exception):
            self.session.close()

    @property
    def alive(self) -> bool:
        return bool(self.session.connected)


class Links:
    """Request id -> its open link. Closing one is idempotent."""

    def __init__(self) -> None:
        self._links: dict[str, Link] = {}
        self._lock = threading.Lock()

    def put(self, request_id: str, link: Link) -> None:
        with self._lock:
            old = self._links.pop(request_id, None)
            self._links[request_id] = link
        if old is not None and old is not link:
            old.close()

    def get(self, request_id: str) -> Link | None:
        with self._lock:
            return self._links.get(request_id)

    def pop(self, request_id: str) -> Link | None:
        with self._lock:
            return self._links.pop(request_id, None)

    def close(self, request_id: str) -> None:
        link = self.pop(request_id)
        if link is not None:
            link.close()

    def close_all(self) -> None:
        with self._lock:
            links = list(self._links.values())
            self._links.clear()
        for link in links:
            link.close()

    def __len__(self) -> int:
        with self._lock:
            return len(self._links)


def ssh_target(machine: dict[str, Any], key_path: Path) -> SshTarget:
    from gpulayer.ssh.target import SshTarget

    via = machine.get("ssh_via")
    return SshTarget(
        str(machine["ssh_host"]),
        int(machine.get("ssh_port") or 22),
        str(machine["ssh_user"]),
        key_path=key_path,
        host_key=machine.get("host_key"),
        via=SshTarget(
            str(via["host"]),
            int(via.get("port") or 22),
            str(via["user"]),
            key_path=Path(via["key_path"]).expanduser(),
            host_key=via.get("host_key"),
        )
        if via
        else None,
    )


def host_keys_path(keys_dir: Path, request_id: str) -> Path:
    # Host keys are pinned for this instance's life; its address may later be another's.
    return keys_dir / f"{request_id}.hosts"


def connect(
    machine: dict[str, Any],
    key_path: Path,
    keys_dir: Path,
    request_id: str,
    timeout: float,
    on_progress: Callable[[str], None] | None = None,
) -> SshSession:
    """A session to the instance, waiting up to ``timeout`` for SSH to answer (saying how the
    wait goes every few seconds through ``on_progress``)."""
    from gpulayer.ssh.hostkeys import JsonHostKeyStore
    from gpulayer.ssh.wait import wait_for_ssh

    host_keys = JsonHostKeyStore(host_keys_path(keys_dir, request_id))
    return wait_for_ssh(
        ssh_target(machine, key_path), timeout, host_keys=host_keys, on_progress=on_progress
    )


def reopen(
    machine: dict[str, Any],
    key_path: Path,
    keys_dir: Path,
    request_id: str,
    *,
    control_port: int,
    tunnel_port: int,
    install_dir: str,
    timeout: float,
) -> Link:
    """Reconnect to a running worker's instance and open its tunnel on the port it uses."""
    from gpulayer.ssh.tunnel import open_reverse_tunnel

    session = connect(machine, key_path, keys_dir, request_id, timeout)
    try:
        bind = machine.get("tunnel_address") or "127.0.0.1"
        tunnel = open_reverse_tunnel(
            session, control_port, remote_port=tunnel_port, remote_bind=bind
        )
    except BaseException:
        session.close()
        raise
    return Link(session, tunnel, install_dir)
