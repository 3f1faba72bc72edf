"""Guards every test run: nothing leaves this machine, and no test touches the user's state."""

from __future__ import annotations

import os

import pytest

_DEAD_PROXY = "http://127.0.0.1:9"  # discard port: any off-machine call fails at once

os.environ.setdefault("HTTPS_PROXY", _DEAD_PROXY)
os.environ.setdefault("HTTP_PROXY", _DEAD_PROXY)
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture(autouse=True)
def _isolated_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path_factory.mktemp("gpulayer-home")
    monkeypatch.setenv("GPULAYER_HOME", str(home))
    monkeypatch.delenv("GPULAYER_SERVER", raising=False)
    monkeypatch.delenv("GPULAYER_TOKEN", raising=False)
