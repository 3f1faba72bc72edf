"""`gpulayer offers --provider gcp` offline: the catalog's offers without credentials."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from tests.support.cli import run_cli
from tests.support.gce_server import isolated_google_env


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, value in isolated_google_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    return Path(os.environ["GPULAYER_HOME"])


def test_offers_of_a_provider_not_enabled_come_from_its_catalog(offline: Path) -> None:
    assert not (offline / "providers.yaml").exists()
    result = run_cli(["offers", "--provider", "gcp", "--gpu", "A100", "--gpus", "8", "--json"])
    assert result.returncode == 0, result.stderr
    offers = json.loads(result.stdout)
    assert offers and all(o["provider"] == "gcp" and o["enabled"] is False for o in offers)
    assert all(o["gpu_name"] == "A100" and o["gpu_count"] == 8 for o in offers)
    assert {"a2-highgpu-8g", "a2-ultragpu-8g"} <= {o["instance_type"] for o in offers}
    prices = [o["hourly_price"] for o in offers]
    assert prices == sorted(prices) and prices[0] > 0

    table = run_cli(["offers", "--provider", "gcp", "--gpu", "L4", "-n", "3"])
    assert table.returncode == 0, table.stderr
    assert "gcp*" in table.stdout and "not enabled in providers.yaml (gcp)" in table.stdout


def test_an_enabled_gcp_on_its_catalog_needs_no_credentials(offline: Path) -> None:
    (offline / "providers.yaml").write_text(
        yaml.safe_dump({"gcp": {"regions": ["europe-west4"], "offers_source": "catalog"}})
    )
    result = run_cli(["offers", "--provider", "gcp", "--gpu", "H100", "--json"])
    assert result.returncode == 0, result.stderr
    offers = json.loads(result.stdout)
    assert offers and {o["region"] for o in offers} == {"europe-west4"}
    assert all(o["enabled"] is True for o in offers)
    assert "warning" not in result.stderr
