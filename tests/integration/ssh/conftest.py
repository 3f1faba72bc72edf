"""SSH tests run against real sshd hosts: network namespaces as root, loopback otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulayer.ssh.hostkeys import JsonHostKeyStore
from tests.support.sshd_hosts import ssh_host, ssh_hosts, sshd_lab

__all__ = ["host_keys", "ssh_host", "ssh_hosts", "sshd_lab"]


@pytest.fixture
def host_keys(tmp_path: Path) -> JsonHostKeyStore:
    """A host-key store of its own per test, as a controller keeps under its data dir."""
    return JsonHostKeyStore(tmp_path / "host-keys")
