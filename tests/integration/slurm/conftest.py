"""Slurm tests run against a real Slurm 22.05 cluster the tests start (one per session), through
the gpulayer command line with a providers.yaml that names it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.daemon import stop_local_control_plane
from tests.support.slurm_cluster import SlurmCluster, slurm_cluster

__all__ = ["slurm_cluster", "slurm_home"]


def slurm_section(cluster: SlurmCluster, **extra: object) -> dict[str, object]:
    login = cluster.login
    assert login is not None
    return {
        "clusters": {
            cluster.name: {
                "login": login.address,
                "port": login.port,
                "user": login.user,
                "key_file": str(login.client_key),
                "host_key": login.host_key,
                **extra,
            }
        }
    }


@pytest.fixture(scope="module")
def slurm_home(
    slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """A gpulayer home whose providers.yaml enables only the test cluster (gpu partition at
    2.5 an hour); its local control plane is stopped after the module."""
    home = tmp_path_factory.mktemp("gpulayer-slurm-home")
    section = slurm_section(slurm_cluster, hourly_price={"gpu": 2.5})
    (home / "providers.yaml").write_text(yaml.safe_dump({"slurm": section}))
    yield home
    stop_local_control_plane(home)


@pytest.fixture(autouse=True)
def _use_slurm_home(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if "slurm_home" in request.fixturenames:
        home = request.getfixturevalue("slurm_home")
        monkeypatch.setenv("GPULAYER_HOME", str(home))
        monkeypatch.setenv("GPULAYER_IDLE_SECONDS", "120")
