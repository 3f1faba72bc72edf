"""`gpulayer offers --provider gcp` offline (the catalog's offers without credentials) and
`gpulayer catalog refresh gcp` against the test server's billing catalog."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cli import run_cli
from tests.support.gce_server import compute_server, isolated_google_env, service_account_file


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
    # One row per machine, region and market, with the zones that have it.
    a2 = next(
        o
        for o in offers
        if o["instance_type"] == "a2-highgpu-8g" and o["region"] == "us-central1" and not o["spot"]
    )
    assert a2["zone"] is None and "us-central1-a" in a2["zones"] and a2["source"] == "catalog"
    prices = [o["hourly_price"] for o in offers]
    assert prices == sorted(prices) and prices[0] > 0
    # Every price says how old it is: the shipped catalog's date.
    from gpulayer_gcp.catalog import shipped_catalog

    assert {o["price_as_of"] for o in offers} == {shipped_catalog().as_of}

    table = run_cli(["offers", "--provider", "gcp", "--gpu", "L4", "-n", "3"])
    assert table.returncode == 0, table.stderr
    assert "gcp*" in table.stdout and "not enabled" in table.stdout
    assert "add `gcp: {}`" in table.stderr


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


def test_an_enabled_gcp_without_credentials_shows_its_catalog_with_a_warning(
    offline: Path,
) -> None:
    (offline / "providers.yaml").write_text(yaml.safe_dump({"gcp": {"regions": ["us-west1"]}}))
    result = run_cli(["offers", "--provider", "gcp", "--gpu", "T4", "--json"])
    assert result.returncode == 0, result.stderr
    offers = json.loads(result.stdout)
    assert offers and {o["region"] for o in offers} == {"us-west1"}
    assert "no Google Cloud credentials found" in result.stderr
    assert "listing its catalog" in result.stderr


def _sku(description: str, usage: str, nanos: int) -> dict[str, Any]:
    return {
        "name": f"services/6F81-5844-456A/skus/{abs(hash(description)) % 10**8}",
        "description": description,
        "category": {
            "resourceFamily": "Compute",
            "resourceGroup": "N1Standard",
            "usageType": usage,
        },
        "serviceRegions": ["us-central1"],
        "pricingInfo": [
            {
                "pricingExpression": {
                    "usageUnit": "h",
                    "tieredRates": [
                        {
                            "startUsageAmount": 0,
                            "unitPrice": {"currencyCode": "USD", "units": "0", "nanos": nanos},
                        }
                    ],
                }
            }
        ],
    }


def test_catalog_refresh_reprices_from_the_billing_catalog(
    offline: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with compute_server({}) as server:
        key = service_account_file(tmp_path / "google", f"{server.url}/token")
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
        server.skus = [
            _sku("N1 Predefined Instance Core running in Americas", "OnDemand", 50_000_000),
            _sku("N1 Predefined Instance Ram running in Americas", "OnDemand", 10_000_000),
            _sku("Nvidia Tesla T4 GPU running in Americas", "OnDemand", 420_000_000),
        ]
        settings = {
            "regions": ["us-central1"],
            "offers_source": "catalog",
            "endpoint_url": server.url,
            "cache_dir": str(tmp_path / "cache"),
        }
        (offline / "providers.yaml").write_text(yaml.safe_dump({"gcp": settings}))
        refreshed = run_cli(["catalog", "refresh", "gcp"])
        assert refreshed.returncode == 0, refreshed.stderr
        written = tmp_path / "cache" / "price_catalog.json"
        assert str(written) in refreshed.stdout
        catalog = json.loads(written.read_text())
        assert "Cloud Billing Catalog API" in catalog["source"]
        assert [c["service"] for c in server.calls("skus.list")] == ["6F81-5844-456A"]

        result = run_cli(["offers", "--provider", "gcp", "--gpu", "T4", "--json"])
        assert result.returncode == 0, result.stderr
        by_type = {o["instance_type"]: o for o in json.loads(result.stdout)}
        # n1-standard-4: 4 vCPUs and 15 GiB at the new rates, plus one T4.
        assert by_type["n1-standard-4+1xt4"]["hourly_price"] == pytest.approx(
            4 * 0.05 + 15 * 0.01 + 0.42
        )
        assert by_type["n1-standard-4+1xt4"]["price_as_of"] == catalog["as_of"]

        # Within the TTL a second refresh reuses the cached SKU list.
        again = run_cli(["catalog", "refresh", "gcp"])
        assert again.returncode == 0, again.stderr
        assert len(server.calls("skus.list")) == 1
