"""Fixtures for integration tests with real server and worker processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import Cluster
from tests.support.servers import ServerProcess, postgres_bin, postgres_cluster


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest) -> Iterator[str | None]:
    if request.param == "sqlite":
        yield None
        return
    if postgres_bin() is None:
        pytest.fail("PostgreSQL is not installed: .ci/run installs it (apt-get install postgresql)")
    with postgres_cluster() as url:
        yield url


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A team server of its own (SQLite in its home), stopped after the test."""
    process = ServerProcess(tmp_path / "server").start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Any]:
    made: list[Cluster] = []

    def make(
        workers: int,
        labels: list[dict[str, str]] | None = None,
        database_url: str | None = None,
        heartbeat_timeout: float = 2.0,
    ) -> Cluster:
        base = tmp_path / f"cluster{len(made)}"
        cluster = Cluster(base, database_url, heartbeat_timeout).start(workers, labels)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.stop()
