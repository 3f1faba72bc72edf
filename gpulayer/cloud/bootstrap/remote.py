"""A worker started on a host: stop it, remove its install dir, read its log."""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING

from gpulayer.cloud.bootstrap.commands import (
    LOG_NAME,
    STOP_GRACE_SECONDS,
    remove_command,
    stop_command,
)
from gpulayer.cloud.bootstrap.errors import RemoteWorkerError

if TYPE_CHECKING:
    from gpulayer.ssh.session import SshSession
    from gpulayer.ssh.tunnel import ReverseTunnel


class RemoteWorker:
    """A worker started by :func:`bootstrap_worker`. Keep it (and its session) alive while the
    worker should reach the control plane: the tunnel is relayed by this process."""

    def __init__(
        self,
        session: SshSession,
        tunnel: ReverseTunnel,
        *,
        pid: int,
        install_dir: str,
        worker_id: str | None,
        wheelhouse_dir: str,
    ) -> None:
        self.session = session
        self.tunnel = tunnel
        self.remote_port = tunnel.remote_port
        self.pid = pid
        self.install_dir = install_dir
        self.worker_id = worker_id
        self.wheelhouse_dir = wheelhouse_dir

    def __repr__(self) -> str:
        return (
            f"<RemoteWorker pid={self.pid} id={self.worker_id} on {self.session.target} "
            f"in {self.install_dir}>"
        )

    def stop(self, grace_seconds: float = STOP_GRACE_SECONDS, timeout: float = 60.0) -> None:
        """End the worker's process group on the host (TERM, KILL after the grace) and close
        the tunnel. Idempotent."""
        from gpulayer.ssh.errors import SshError

        try:
            code, tail = run_collect(
                self.session, stop_command(self.install_dir, grace_seconds), timeout
            )
            if code != 0:
                raise RemoteWorkerError(
                    f"stopping the worker in {self.install_dir} on {self.session.target} "
                    f"failed (exit {code}): {' | '.join(tail[-5:])}"
                )
        except SshError as exc:
            raise RemoteWorkerError(
                f"cannot stop the worker on {self.session.target}: {exc}"
            ) from exc
        finally:
            self.tunnel.close()

    def cleanup(self, timeout: float = 60.0) -> None:
        """Remove the install dir (venv, jobs, logs); nothing else. Idempotent."""
        from gpulayer.ssh.errors import SshError

        try:
            code, tail = run_collect(self.session, remove_command(self.install_dir), timeout)
        except SshError as exc:
            raise RemoteWorkerError(
                f"cannot remove {self.install_dir} on {self.session.target}: {exc}"
            ) from exc
        if code != 0:
            raise RemoteWorkerError(
                f"removing {self.install_dir} on {self.session.target} failed (exit {code}): "
                f"{' | '.join(tail[-5:])}"
            )

    def close(self) -> None:
        """Close the tunnel and the SSH session (after :meth:`stop` and :meth:`cleanup`)."""
        self.tunnel.close()
        self.session.close()

    def log_tail(self, lines: int = 50, timeout: float = 30.0) -> str:
        """The end of the worker's own log on the host, for diagnosing a worker that left."""
        path = posixpath.join(self.install_dir, LOG_NAME)
        result = self.session.run(["tail", "-n", str(int(lines)), path], timeout=timeout)
        return result.stdout


def run_collect(session: SshSession, command: str, timeout: float) -> tuple[int, list[str]]:
    result = session.run(command, timeout=timeout)
    return result.exit_code, (result.stdout + result.stderr).splitlines()
