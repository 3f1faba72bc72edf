"""End-to-end tests share one local control plane per module, stopped afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import stop_local_control_plane


@pytest.fixture(scope="module")
def shared_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("gpulayer-e2e-home")
    yield home
    stop_local_control_plane(home)


@pytest.fixture(autouse=True)
def _use_shared_home(shared_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPULAYER_HOME", str(shared_home))
    monkeypatch.setenv("GPULAYER_IDLE_SECONDS", "120")
    return shared_home
