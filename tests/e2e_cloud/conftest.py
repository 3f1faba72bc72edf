"""Cloud journeys: one local control plane per module, sshd hosts as the rented machines."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import stop_local_control_plane
from tests.support.package_index import torch_index
from tests.support.sshd_hosts import ssh_host, ssh_hosts, sshd_lab

__all__ = ["cloud_home", "ssh_host", "ssh_hosts", "sshd_lab", "torch_index"]


@pytest.fixture(scope="module")
def module_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("gpulayer-cloud-home")
    yield home
    stop_local_control_plane(home)


@pytest.fixture
def cloud_home(module_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("GPULAYER_HOME", str(module_home))
    monkeypatch.setenv("GPULAYER_IDLE_SECONDS", "300")
    yield module_home
    (module_home / "providers.yaml").unlink(missing_ok=True)
