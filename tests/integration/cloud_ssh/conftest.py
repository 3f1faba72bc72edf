"""Bootstrap and the ssh provider against real sshd hosts (machines of their own as root,
loopback otherwise), a real control plane process, and a wheelhouse built from this interpreter.

A test host shares neither disk nor processes with this machine: what a test checks on it (an
install dir, a worker's log, its processes) it asks the host for (``host.exists``,
``host.read_text``, ``processes_mentioning(host, ...)``), and what it puts there goes over SFTP.
Install dirs are named after each test's tmp path, so they differ per test on a loopback host.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer.cloud.wheelhouse import Wheelhouse, build_wheelhouse
from tests.integration.cloud_ssh.helpers import ControlPlane
from tests.support.servers import ServerProcess
from tests.support.sshd_hosts import ssh_host, ssh_hosts, sshd_lab

__all__ = ["control_plane", "ssh_host", "ssh_hosts", "sshd_lab", "wheelhouse"]


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Wheelhouse:
    """Built once per session from this interpreter's installed distributions."""
    return build_wheelhouse(tmp_path_factory.mktemp("wheelhouse-cache"))


@pytest.fixture
def control_plane(tmp_path: Path) -> Iterator[ControlPlane]:
    server = ServerProcess(tmp_path / "server", heartbeat_timeout=5.0).start()
    try:
        yield ControlPlane(server)
    finally:
        server.stop()
