"""One authenticated SSH connection: run commands with streamed output, move files over SFTP."""

from __future__ import annotations

import codecs
import os
import posixpath
import select
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, cast

from gpulayer.ssh.command import render_command
from gpulayer.ssh.errors import (
    HostKeyMismatch,
    SshAuthError,
    SshCommandTimeout,
    SshConnectionError,
    SshSessionClosed,
    SshTransferError,
)
from gpulayer.ssh.hostkeys import (
    HostKeyPolicy,
    HostKeyStore,
    MemoryHostKeyStore,
    preferred_host_key_algorithms,
)
from gpulayer.ssh.keys import load_private_key
from gpulayer.ssh.target import SshTarget

if TYPE_CHECKING:
    import paramiko

Stream = Literal["stdout", "stderr"]
OutputCallback = Callable[[Stream, str], None]
"""Called with each piece of output as it arrives; pieces are not split on lines."""

_CHUNK = 65536
_IDLE_WAIT_SECONDS = 0.02


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str


class SshSession:
    """A session to one target. Without ``host_keys`` a first-seen key is trusted only for the
    life of this object; pass a :class:`~gpulayer.ssh.hostkeys.JsonHostKeyStore` to keep it.

    Use as a context manager, or call :meth:`connect` and :meth:`close`."""

    def __init__(
        self,
        target: SshTarget,
        *,
        host_keys: HostKeyStore | None = None,
        keepalive_seconds: int = 15,
    ) -> None:
        self.target = target
        self.host_keys: HostKeyStore = host_keys if host_keys is not None else MemoryHostKeyStore()
        self.keepalive_seconds = keepalive_seconds
        self._client: paramiko.SSHClient | None = None
        self._jump: SshSession | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._sftp_lock = threading.Lock()
        self._timeout = 10.0

    def __repr__(self) -> str:
        state = "connected" if self.connected else "not connected"
        return f"<SshSession {self.target} {state}>"

    # -- connection ---------------------------------------------------------------------------

    def connect(self, timeout: float = 10.0) -> SshSession:
        """Open the connection and authenticate; ``timeout`` bounds each handshake step.

        Raises HostKeyMismatch, SshAuthError or SshConnectionError; returns self."""
        import paramiko

        if self._client is not None:
            return self
        target = self.target
        pkey = load_private_key(target.key_path)
        policy = HostKeyPolicy(target.host, target.port, target.host_key, self.host_keys)
        expected = policy.expected()

        def steered_transport(sock: Any, /, **options: Any) -> paramiko.Transport:
            # paramiko's keyword arguments differ between releases; pass them all through.
            transport = paramiko.Transport(sock, **options)
            security = transport.get_security_options()
            security.key_types = preferred_host_key_algorithms(expected, list(security.key_types))
            return transport

        jump, sock = self._through_jump(timeout)
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(cast("paramiko.MissingHostKeyPolicy", policy))
        try:
            try:
                client.connect(
                    target.host,
                    port=target.port,
                    username=target.user,
                    pkey=pkey,
                    timeout=timeout,
                    banner_timeout=timeout,
                    auth_timeout=timeout,
                    channel_timeout=timeout,
                    allow_agent=False,
                    look_for_keys=False,
                    transport_factory=steered_transport,
                    sock=sock,
                )
            except HostKeyMismatch:
                raise
            except paramiko.AuthenticationException as exc:
                raise SshAuthError(f"{target} refused key {target.key_path}: {exc}") from exc
            except (OSError, EOFError, paramiko.SSHException) as exc:
                raise SshConnectionError(f"cannot connect to {target}: {_describe(exc)}") from exc
            policy.logged_in()
        except BaseException:
            client.close()
            if jump is not None:
                jump.close()
            raise
        transport = client.get_transport()
        if transport is not None and self.keepalive_seconds > 0:
            transport.set_keepalive(self.keepalive_seconds)
        self._client = client
        self._jump = jump
        self._timeout = timeout
        return self

    def _through_jump(self, timeout: float) -> tuple[SshSession | None, Any]:
        """For a target reached through another host: that host's session, and a channel from
        it to this target's SSH port to run this session over."""
        import paramiko

        via = self.target.via
        if via is None:
            return None, None
        jump = SshSession(via, host_keys=self.host_keys, keepalive_seconds=self.keepalive_seconds)
        jump.connect(timeout)
        where = (self.target.host, self.target.port)
        try:
            channel = jump.transport.open_channel(
                "direct-tcpip", where, ("127.0.0.1", 0), timeout=timeout
            )
        except (OSError, EOFError, paramiko.SSHException) as exc:
            jump.close()
            raise SshConnectionError(
                f"cannot reach {self.target.host}:{self.target.port} from {via}: {_describe(exc)}"
            ) from exc
        return jump, channel

    @property
    def connected(self) -> bool:
        if self._client is None:
            return False
        transport = self._client.get_transport()
        return transport is not None and transport.is_active()

    @property
    def transport(self) -> paramiko.Transport:
        transport = self._require().get_transport()
        if transport is None or not transport.is_active():
            raise SshSessionClosed(f"session to {self.target} has lost its connection")
        return transport

    def close(self) -> None:
        """End the connection; safe to call more than once."""
        with self._sftp_lock:
            if self._sftp is not None:
                self._sftp.close()
                self._sftp = None
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._jump is not None:
            self._jump.close()
            self._jump = None

    def __enter__(self) -> SshSession:
        return self.connect(self._timeout)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _require(self) -> paramiko.SSHClient:
        if self._client is None:
            raise SshSessionClosed(f"session to {self.target} is not connected")
        return self._client

    # -- commands -----------------------------------------------------------------------------

    def exec(
        self,
        command: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        on_output: OutputCallback | None = None,
        timeout: float | None = None,
    ) -> int:
        """Run ``command`` and return its exit code, passing output to ``on_output`` as it comes.

        The exit code is -1 when the remote process ended on a signal. On ``timeout`` the
        channel is closed and SshCommandTimeout raised; sshd does not signal a command whose
        channel closes, so a remote process that must die with it needs its own bound
        (``timeout 60 cmd``) or the machine's teardown."""
        import paramiko

        line = render_command(command, env)
        try:
            channel = self._start(line)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise SshConnectionError(f"cannot start command on {self.target}: {exc}") from exc
        try:
            return _pump(channel, line, on_output, timeout)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise SshConnectionError(f"lost {self.target} while running a command: {exc}") from exc
        finally:
            channel.close()

    def _start(self, line: str) -> paramiko.Channel:
        """A channel running ``line``. sshd may refuse a channel while closed ones still count
        against its session limit; such a start is tried again while the connection lives."""
        import paramiko

        from gpulayer.backoff import SSH_CHANNEL_START

        transport = self.transport
        for attempt in SSH_CHANNEL_START.retrying(
            retry_on=(paramiko.SSHException,), retry_if=lambda _: transport.is_active()
        ):
            with attempt:
                channel = transport.open_session(timeout=self._timeout)
                try:
                    channel.exec_command(_WITHOUT_INPUT + line)
                except BaseException:
                    channel.close()
                    raise
                return channel
        raise AssertionError("unreachable")  # tenacity re-raises the last error

    def run(
        self,
        command: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Run ``command`` and collect its output."""
        out: list[str] = []
        err: list[str] = []

        def collect(stream: Stream, text: str) -> None:
            (out if stream == "stdout" else err).append(text)

        code = self.exec(command, env=env, on_output=collect, timeout=timeout)
        return CommandResult(code, "".join(out), "".join(err))

    # -- files --------------------------------------------------------------------------------

    def put(self, local: Path | str, remote: str, *, mode: int | None = None) -> None:
        """Upload one file. The remote file gets ``mode``, else the local file's permission bits
        (so scripts stay executable); its directory must exist, see :meth:`makedirs`."""
        local = Path(local)
        if not local.is_file():
            raise SshTransferError(f"cannot upload {local}: not a file")
        bits = mode if mode is not None else stat.S_IMODE(local.stat().st_mode)
        with self._sftp_lock:
            sftp = self._sftp_client()
            try:
                sftp.put(str(local), remote, confirm=True)
                sftp.chmod(remote, bits)
            except (OSError, EOFError) as exc:
                raise SshTransferError(
                    f"cannot upload {local} to {self.target}:{remote}: {_describe(exc)}"
                ) from exc

    def put_dir(self, local_dir: Path | str, remote_dir: str) -> int:
        """Upload a directory tree into ``remote_dir`` (created as needed); returns the file count.

        Symbolic links to directories are not followed, so a link loop cannot recurse forever."""
        local_dir = Path(local_dir)
        if not local_dir.is_dir():
            raise SshTransferError(f"cannot upload {local_dir}: not a directory")
        self.makedirs(remote_dir)
        count = 0
        for root, dirs, files in os.walk(local_dir):
            dirs.sort()
            relative = Path(root).relative_to(local_dir)
            remote_root = posixpath.join(remote_dir, *relative.parts)
            for name in dirs:
                if not (Path(root) / name).is_symlink():
                    self.makedirs(posixpath.join(remote_root, name))
            for name in sorted(files):
                self.put(Path(root) / name, posixpath.join(remote_root, name))
                count += 1
        return count

    def makedirs(self, remote_dir: str) -> None:
        """``mkdir -p`` over SFTP."""
        with self._sftp_lock:
            sftp = self._sftp_client()
            prefix = "/" if remote_dir.startswith("/") else ""
            for part in [p for p in remote_dir.split("/") if p]:
                prefix = posixpath.join(prefix, part) if prefix else part
                try:
                    if stat.S_ISDIR(sftp.stat(prefix).st_mode or 0):
                        continue
                    raise SshTransferError(f"{self.target}:{prefix} exists and is not a directory")
                except FileNotFoundError:
                    pass
                except (OSError, EOFError) as exc:
                    raise SshTransferError(
                        f"cannot inspect {self.target}:{prefix}: {_describe(exc)}"
                    ) from exc
                try:
                    sftp.mkdir(prefix)
                except (OSError, EOFError) as exc:
                    raise SshTransferError(
                        f"cannot create {self.target}:{prefix}: {_describe(exc)}"
                    ) from exc

    def get(self, remote: str, local: Path | str) -> None:
        """Download one file. It appears at ``local`` whole or not at all."""
        local = Path(local)
        local.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=local.parent, prefix=f".{local.name}.")
        os.close(fd)
        try:
            with self._sftp_lock:
                self._sftp_client().get(remote, tmp)
            os.replace(tmp, local)
        except (OSError, EOFError) as exc:
            Path(tmp).unlink(missing_ok=True)
            raise SshTransferError(
                f"cannot download {self.target}:{remote} to {local}: {_describe(exc)}"
            ) from exc
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _sftp_client(self) -> paramiko.SFTPClient:
        import paramiko

        if self._sftp is None:
            try:
                self._sftp = self._require().open_sftp()
            except (OSError, EOFError, paramiko.SSHException) as exc:
                raise SshTransferError(f"cannot open SFTP on {self.target}: {exc}") from exc
        return self._sftp


# No input is ever sent: a command that reads stdin sees EOF at once, never waits forever. The
# host's shell gives it /dev/null rather than the channel getting an EOF from here: paramiko
# sends an EOF outside the channel's lock, so one that crosses the close of a command that
# ended at once reaches sshd after our CLOSE, and sshd drops the whole connection for it
# ("ieof packet referred to nonexistent channel"; 2 batches in 200 of 24 commands on 8 threads).
_WITHOUT_INPUT = "exec </dev/null; "


def _pump(
    channel: paramiko.Channel,
    line: str,
    on_output: OutputCallback | None,
    timeout: float | None,
) -> int:
    """Forward output until the command has exited and both streams reached EOF."""
    decoders = {
        "stdout": codecs.getincrementaldecoder("utf-8")(errors="replace"),
        "stderr": codecs.getincrementaldecoder("utf-8")(errors="replace"),
    }

    def emit(stream: Stream, data: bytes, final: bool = False) -> None:
        text = decoders[stream].decode(data, final=final)
        if text and on_output is not None:
            on_output(stream, text)

    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        moved = False
        if channel.recv_ready():
            emit("stdout", channel.recv(_CHUNK))
            moved = True
        if channel.recv_stderr_ready():
            emit("stderr", channel.recv_stderr(_CHUNK))
            moved = True
        if moved:
            continue
        # sshd may report the exit status before the last output, so wait for EOF as well.
        if channel.exit_status_ready() and (channel.eof_received or channel.closed):
            if not channel.recv_ready() and not channel.recv_stderr_ready():
                break
            continue
        if deadline is not None and time.monotonic() >= deadline:
            raise SshCommandTimeout(line, cast(float, timeout))
        wait = _IDLE_WAIT_SECONDS
        if deadline is not None:
            wait = max(0.0, min(wait, deadline - time.monotonic()))
        if channel.eof_received:
            # After EOF the channel's fileno stays readable; selecting on it would spin.
            time.sleep(wait)
        else:
            # The channel's fileno wakes us on stdout; stderr is picked up within one idle wait.
            select.select([channel], [], [], wait)
    emit("stdout", b"", final=True)
    emit("stderr", b"", final=True)
    return channel.recv_exit_status()


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
