"""Running Slurm's commands where the cluster's users do: on its login node over SSH, or on
this machine when it is a login node itself."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpulayer_slurm.connections import CONNECTIONS
from gpulayer_slurm.errors import ClusterUnreachable, SlurmCommandError
from gpulayer_slurm.settings import SlurmCluster

if TYPE_CHECKING:
    from gpulayer.cloud import LaunchRequest, SshSession, SshVia


@dataclass(frozen=True)
class Output:
    exit_code: int
    stdout: str
    stderr: str


class LoginNode:
    """One cluster's login node. Each :meth:`run` is one command line in a shell there, on the
    connection this controller keeps to it (:mod:`gpulayer_slurm.connections`)."""

    def __init__(
        self,
        name: str,
        cluster: SlurmCluster,
        *,
        host_keys_dir: Path,
        connect_timeout: float,
        command_timeout: float,
    ) -> None:
        self.name = name
        self.cluster = cluster
        self._host_keys_dir = host_keys_dir
        self._connect_timeout = connect_timeout
        self._command_timeout = command_timeout
        self._home: str | None = None

    def run(self, command: str, *, timeout: float | None = None, once: bool = False) -> Output:
        """``once``: the command must not run twice (sbatch), so a connection that drops
        under it is not tried again with it."""
        limit = timeout or self._command_timeout
        if self.cluster.local:
            return self._run_here(command, limit)
        return self._run_over_ssh(command, limit, once=once)

    def checked(self, command: str, *, what: str, timeout: float | None = None) -> str:
        """stdout of ``command``; a non-zero exit raises with its last lines."""
        done = self.run(command, timeout=timeout)
        if done.exit_code != 0:
            raise SlurmCommandError(self.name, what, done.exit_code, done.stderr or done.stdout)
        return done.stdout

    def path(self, setting: str) -> str:
        """A path setting as the login node reads it: ``~/`` is the login user's home."""
        if not setting.startswith("~/"):
            return setting
        if self._home is None:
            home = self.checked('printf %s "$HOME"', what="reading the login user's home")
            if not home.startswith("/"):
                raise SlurmCommandError(self.name, "reading the login user's home", 0, home)
            self._home = home.rstrip("/")
        return f"{self._home}/{setting[2:]}"

    def ssh_via(self) -> SshVia | None:
        """How the controller reaches the allocated nodes' sshd: through this login node, with
        its credential and the host key it was pinned to; None where the nodes are reached
        directly (or this machine is the login node)."""
        from gpulayer.cloud import JsonHostKeyStore, SshVia

        c = self.cluster
        if c.local or not c.nodes_via_login:
            return None
        assert c.user is not None and c.key_file is not None  # settings hold it
        pinned = c.host_key or JsonHostKeyStore(self._host_keys_dir).get(c.login, c.port)
        return SshVia(
            host=c.login, port=c.port, user=c.user, key_path=str(c.key_file), host_key=pinned
        )

    def _run_here(self, command: str, timeout: float) -> Output:
        try:
            done = subprocess.run(
                ["sh", "-c", command], capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return Output(124, "", f"timed out after {timeout:g} s")
        return Output(done.returncode, done.stdout, done.stderr)

    def _run_over_ssh(self, command: str, timeout: float, *, once: bool) -> Output:
        from gpulayer.cloud import SshError

        c = self.cluster
        assert c.user is not None and c.key_file is not None  # settings hold it
        key = (
            c.login, str(c.port), c.user, str(c.key_file), c.host_key or "",
            str(self._host_keys_dir),
        )  # fmt: skip
        try:
            ran = CONNECTIONS.run(key, self._connect, command, timeout=timeout, once=once)
        except SshError as exc:
            raise ClusterUnreachable(
                self.name, f"login node {c.login} does not answer: {exc}"
            ) from exc
        return Output(ran.exit_code, ran.stdout, ran.stderr)

    def _connect(self) -> SshSession:
        from gpulayer.cloud import JsonHostKeyStore, SshSession, SshTarget

        c = self.cluster
        assert c.user is not None and c.key_file is not None  # settings hold it
        target = SshTarget(c.login, c.port, c.user, key_path=c.key_file, host_key=c.host_key)
        session = SshSession(target, host_keys=JsonHostKeyStore(self._host_keys_dir))
        return session.connect(timeout=self._connect_timeout)


def add_key_command(login: LoginNode, request: LaunchRequest) -> str:
    """The command that adds the request's job key to the cluster's authorized_keys (a line
    tagged with the request id, which its end takes out again)."""
    from gpulayer.cloud import ProviderError, add_authorized_key_command

    try:
        return add_authorized_key_command(
            login.cluster.authorized_keys, request.ssh_public_key, request.request_id
        )
    except ValueError as exc:
        raise ProviderError(f"ssh_public_key: {exc}", provider="slurm") from None
