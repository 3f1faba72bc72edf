"""The GCP provider's pure parts: the shipped catalog, offers from it, instance-type names,
SKU parsing, error classification, labels, settings. No network, no SDK client."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from gpulayer_gcp.billing import parse_sku, reprice
from gpulayer_gcp.catalog import PriceCatalog, shipped_catalog
from gpulayer_gcp.errors import classify
from gpulayer_gcp.instances import from_labels, label_filter, to_labels
from gpulayer_gcp.offers import (
    Machine,
    ZoneTypes,
    build_offers,
    catalog_zones,
    machines_for,
    parse_instance_type,
    price_of,
)
from gpulayer_gcp.settings import GcpSettings, resource_name

from gpulayer.cloud.errors import CapacityError, ProviderSettingsError, QuotaError
from gpulayer.cloud.settings import load_settings


@pytest.fixture(scope="module")
def catalog() -> PriceCatalog:
    return shipped_catalog()


def test_the_shipped_catalog_is_dated_sourced_and_consistent(catalog: PriceCatalog) -> None:
    assert catalog.as_of and catalog.currency == "USD"
    assert catalog.sources and all(s.startswith("https://") for s in catalog.sources)
    for region, prices in catalog.regions.items():
        assert prices.zones and all(z.startswith(f"{region}-") for z in prices.zones)
        for name, (on_demand, spot) in prices.machines.items():
            shape = catalog.machine_types[name]
            assert on_demand and on_demand > 0 and (spot is None or 0 < spot < on_demand), name
            if shape.accelerator:
                assert shape.accelerator in prices.gpus, (region, name)
        for accelerator, zones in prices.accelerator_zones.items():
            assert accelerator in catalog.accelerators
            assert set(zones) <= set(prices.zones)
            on_demand, spot = prices.gpus[accelerator]
            # A GPU may lack a public spot price (then it is rented on demand only).
            assert on_demand and (spot is None or 0 < spot < on_demand), (region, accelerator)


def test_catalog_offers_cover_the_families(catalog: PriceCatalog) -> None:
    zones = catalog_zones(catalog, "us-central1")
    offers = build_offers(zones, catalog, "us-central1", accelerator="cuda", allow_spot=True)
    by_type = {o.instance_type: o for o in offers if not o.spot}
    a100 = by_type["a2-highgpu-8g"]
    assert (a100.gpu_name, a100.gpu_count, a100.gpu_memory_gb) == ("A100", 8, 40)
    assert by_type["a2-ultragpu-1g"].gpu_memory_gb == 80
    assert by_type["a3-highgpu-8g"].cuda_compute_capability == "9.0"
    assert by_type["g2-standard-4"].gpu_name == "L4"
    for gpu in ("t4", "v100", "p100", "p4"):
        assert f"n1-standard-8+1x{gpu}" in by_type
    # V100 allows at most 12 vCPUs per GPU with one GPU; T4 allows 48.
    assert "n1-standard-16+1xv100" not in by_type and "n1-standard-16+2xv100" in by_type
    assert "n1-standard-32+1xt4" in by_type and "n1-standard-64+1xt4" not in by_type
    assert "n1-standard-8+3xt4" not in by_type
    spot = next(o for o in offers if o.instance_type == "g2-standard-4" and o.spot)
    assert (
        spot.hourly_price is not None and spot.hourly_price < by_type["g2-standard-4"].hourly_price
    )  # type: ignore[operator]
    # Price = host + GPUs.
    prices = catalog.regions["us-central1"]
    t4 = by_type["n1-standard-8+2xt4"]
    assert t4.hourly_price == pytest.approx(
        prices.machines["n1-standard-8"][0] + 2 * prices.gpus["nvidia-tesla-t4"][0]
    )


SKYPILOT_GCP = "skypilot-catalog/blob/006059e0f18acb1341e22a27751e9f80df6ba92f"

# (machine type, region, host [on-demand, spot], one GPU [on-demand, spot]) as read from the
# source each type records (catalogs/v8/gcp/vms.csv at 006059e: the host row, and the 8-GPU
# accelerator row divided by 8), or for the GPUs of A2 and A3 Edge the catalog's own rows.
ADDED_FACTS = [
    ("a3-ultragpu-8g", "us-central1", (12.266, 3.74713), (74.49392 / 8, 37.2472 / 8)),
    ("a3-ultragpu-8g", "us-east4", (12.266, 2.80034), (74.49392 / 8, 29.2536 / 8)),
    ("a3-megagpu-8g", "us-central1", (9.46006, 2.88933), (82.75421 / 8, 25.2808 / 8)),
    ("a3-megagpu-8g", "europe-west4", (9.93306, 2.27469), (107.58048 / 8, 24.6032 / 8)),
    ("a3-edgegpu-8g", "us-east4", (9.46006, 2.15966), None),
    ("a2-megagpu-16g", "us-central1", (8.79698, 4.39824), None),
]


# (region, "machines" or "gpus", name, (on-demand, spot)) as read from catalogs/v8/gcp/vms.csv
# at 006059e: a host row, or an accelerator row of count 1. The source's A100-80GB spot price in
# europe-west4 (2.1626) is above its on-demand price, so no spot offer is made of it.
REGION_FACTS = [
    ("us-east4", "machines", "n1-standard-8", (0.42797, 0.09039)),
    ("us-east4", "machines", "e2-standard-4", (0.15094, 0.07266)),
    ("us-east4", "machines", "g2-standard-4", (0.14631, 0.05851)),
    ("us-east4", "gpus", "nvidia-l4", (0.55821, 0.2233)),
    ("us-east4", "gpus", "nvidia-h100-80gb", (9.79655, 2.2356)),
    ("europe-west4", "machines", "n1-highmem-16", (1.04189, 0.41678)),
    ("europe-west4", "machines", "g2-standard-96", (3.70286, 1.7159)),
    ("europe-west4", "gpus", "nvidia-tesla-t4", (0.3675, 0.175)),
    ("europe-west4", "gpus", "nvidia-tesla-v100", (2.604, 1.0443)),
    ("europe-west4", "gpus", "nvidia-tesla-a100", (1.61365, 1.1691)),
    ("europe-west4", "gpus", "nvidia-a100-80gb", (2.03285, None)),
]


@pytest.mark.parametrize(("region", "kind", "name", "price"), REGION_FACTS)
def test_prices_outside_us_central1_are_looked_up_not_scaled(
    catalog: PriceCatalog, region: str, kind: str, name: str, price: tuple[float, float | None]
) -> None:
    assert SKYPILOT_GCP in catalog.price_sources[region]
    assert getattr(catalog.regions[region], kind)[name] == price
    if kind == "gpus" and name == "nvidia-l4":
        offers = build_offers(
            catalog_zones(catalog, region), catalog, region, accelerator="cuda", allow_spot=True
        )
        g2 = {o.spot: o.hourly_price for o in offers if o.instance_type == "g2-standard-4"}
        host = catalog.regions[region].machines["g2-standard-4"]
        assert g2 == {
            False: pytest.approx(host[0] + price[0]),
            True: pytest.approx((host[1] or 0) + (price[1] or 0)),
        }


@pytest.mark.parametrize(("name", "region", "host", "gpu"), ADDED_FACTS)
def test_added_machine_types_are_the_facts_they_record(
    catalog: PriceCatalog,
    name: str,
    region: str,
    host: tuple[float, float],
    gpu: tuple[float, float] | None,
) -> None:
    assert SKYPILOT_GCP in catalog.price_sources[name]
    prices = catalog.regions[region]
    assert prices.machines[name] == host
    shape = catalog.machine_types[name]
    assert shape.accelerator is not None
    if gpu is not None:
        assert prices.gpus[shape.accelerator] == pytest.approx(gpu, abs=1e-6)
    offers = build_offers(
        catalog_zones(catalog, region), catalog, region, accelerator="cuda", allow_spot=False
    )
    priced = sorted({o.hourly_price or 0 for o in offers if o.instance_type == name})
    per_gpu = prices.gpus[shape.accelerator][0]
    assert per_gpu is not None
    assert priced == [pytest.approx(host[0] + shape.accelerator_count * per_gpu, abs=1e-6)]


def test_b200_is_known_but_unpriced_for_it_is_not_sold_on_demand(catalog: PriceCatalog) -> None:
    from gpulayer.cloud import gpu_facts

    shape = catalog.machine_types["a4-highgpu-8g"]
    facts = catalog.accelerators[shape.accelerator or ""]
    assert (facts.gpu, shape.accelerator_count) == ("B200", 8)
    assert facts.memory_gb == gpu_facts("B200").memory_gb  # type: ignore[union-attr]
    # No on-demand price exists: listed nowhere offline, and the catalog says why.
    assert all("a4-highgpu-8g" not in prices.machines for prices in catalog.regions.values())
    assert "not on demand" in catalog.price_sources["a4-highgpu-8g"]
    assert "no public per-region price" in catalog.price_sources["a4-highgpu-8g"].lower()


SKYPILOT_G4 = "https://github.com/skypilot-org/skypilot/pull/10533"
DSTACK_G4 = "https://github.com/dstackai/dstack/pull/3213"
# As read from SKYPILOT_G4: us-west1 on-demand, g4-standard-48 host and one RTX PRO 6000.
G4_HOST_48, RTX_PRO_6000 = 3.40428, 1.09565
# As read from DSTACK_G4: on-demand totals in us-central1, by GPU count.
G4_US_CENTRAL1 = {1: 4.5001, 2: 9.0002, 4: 18.0003, 8: 36.0006}


@pytest.mark.parametrize("count", [1, 2, 4, 8])
def test_rtx_pro_6000_machines_are_the_facts_they_record(catalog: PriceCatalog, count: int) -> None:
    from gpulayer.cloud import gpu_facts

    name = f"g4-standard-{48 * count}"
    shape = catalog.machine_types[name]
    facts = catalog.accelerators[shape.accelerator or ""]
    assert (facts.gpu, shape.accelerator_count) == ("RTX PRO Server 6000", count)
    assert facts.memory_gb == gpu_facts("RTX PRO Server 6000").memory_gb  # type: ignore[union-attr]
    assert (shape.vcpus, shape.memory_gb) == (48 * count, 180 * count)
    source = catalog.price_sources[name]
    assert SKYPILOT_G4 in source and DSTACK_G4 in source
    west = catalog.regions["us-west1"]
    assert west.machines[name] == (pytest.approx(G4_HOST_48 * count), None)
    assert west.gpus["nvidia-rtx-pro-6000"] == (RTX_PRO_6000, None)
    offers = build_offers(
        catalog_zones(catalog, "us-west1"), catalog, "us-west1", accelerator="cuda", allow_spot=True
    )
    mine = [o for o in offers if o.instance_type == name]
    # Offered on demand only, in the zone the source saw it, at host plus GPUs.
    assert [(o.zone, o.spot) for o in mine] == [("us-west1-a", False)]
    expected = count * (G4_HOST_48 + RTX_PRO_6000)
    assert mine[0].hourly_price == pytest.approx(expected, abs=1e-6)
    # The second source's us-central1 totals agree to within 0.01 %.
    assert expected == pytest.approx(G4_US_CENTRAL1[count], rel=1e-4)
    # Other regions have no split of their own: unpriced there, not guessed.
    others = [r for r in catalog.regions if r != "us-west1"]
    assert all(name not in catalog.regions[r].machines for r in others)


def test_instance_type_names_round_trip(catalog: PriceCatalog) -> None:
    for machine in (
        Machine("n1-standard-8", "nvidia-tesla-t4", 2, attached=True),
        Machine("a2-highgpu-1g", "nvidia-tesla-a100", 1),
        Machine("e2-standard-2"),
    ):
        assert parse_instance_type(machine.instance_type, catalog) == machine
    with pytest.raises(ValueError, match="unknown GPU"):
        parse_instance_type("n1-standard-8+1xk80", catalog)


def test_unpriced_gpu_machines_are_offered_without_a_price(catalog: PriceCatalog) -> None:
    zones = {
        "us-central1-a": ZoneTypes(
            {"n1-ultramem-40": catalog.machine_types["n1-standard-32"]},
            {"nvidia-tesla-t4": 4},
        )
    }
    gpu = build_offers(zones, catalog, "us-central1", accelerator="cuda", allow_spot=False)
    cpu = build_offers(zones, catalog, "us-central1", accelerator="cpu", allow_spot=False)
    assert gpu and all(o.hourly_price is None for o in gpu)
    assert cpu == []  # CPU machines are placed by price: none without one
    assert (
        price_of(
            Machine("a2-highgpu-1g", "nvidia-tesla-a100", 1), catalog, "mars-north1", spot=False
        )
        is None
    )
    assert list(machines_for(zones["us-central1-a"], catalog, "rocm")) == []


SKUS: list[dict[str, Any]] = [
    {
        "description": "N1 Predefined Instance Core running in Americas",
        "category": {"resource_family": "Compute", "usage_type": "OnDemand"},
        "service_regions": ["us-central1", "us-west1"],
        "pricing_info": [
            {
                "pricing_expression": {
                    "tiered_rates": [
                        {"unit_price": {"units": "0", "nanos": 40_000_000, "currency_code": "USD"}}
                    ]
                }
            }
        ],
    },
    {
        "description": "N1 Predefined Instance Ram running in Americas",
        "category": {"resource_family": "Compute", "usage_type": "OnDemand"},
        "service_regions": ["us-central1"],
        "pricing_info": [
            {"pricing_expression": {"tiered_rates": [{"unit_price": {"nanos": 5_000_000}}]}}
        ],
    },
    {
        "description": "Spot Preemptible Nvidia Tesla T4 GPU running in Americas",
        "category": {"resource_family": "Compute", "usage_type": "Preemptible"},
        "service_regions": ["us-central1"],
        "pricing_info": [
            {"pricing_expression": {"tiered_rates": [{"unit_price": {"nanos": 111_000_000}}]}}
        ],
    },
    {
        "description": "Commitment v1: Nvidia Tesla T4 GPU running in Americas",
        "category": {"resource_family": "Compute", "usage_type": "Commit1Yr"},
        "service_regions": ["us-central1"],
        "pricing_info": [{"pricing_expression": {"tiered_rates": [{"unit_price": {"nanos": 1}}]}}],
    },
    {
        "description": "Nvidia L4 GPU running in Americas",
        "category": {"resource_family": "Compute", "usage_type": "OnDemand"},
        "service_regions": ["us-central1"],
        "pricing_info": [
            {"pricing_expression": {"tiered_rates": [{"unit_price": {"nanos": 600_000_000}}]}}
        ],
    },
]


def test_skus_become_rates_and_reprice_the_catalog(catalog: PriceCatalog) -> None:
    core = parse_sku(SKUS[0])
    assert [(r.kind, r.key, r.spot, r.region) for r in core] == [
        ("core", "n1", False, "us-central1"),
        ("core", "n1", False, "us-west1"),
    ]
    assert core[0].usd_per_hour == pytest.approx(0.04)
    assert parse_sku(SKUS[3]) == []  # commitments are not what a launch pays
    spot_t4 = parse_sku(SKUS[2])[0]
    assert (spot_t4.kind, spot_t4.key, spot_t4.spot) == ("gpu", "nvidia-tesla-t4", True)

    repriced = reprice(catalog, SKUS, ["us-central1"])
    prices = repriced.regions["us-central1"]
    assert prices.machines["n1-standard-4"][0] == pytest.approx(4 * 0.04 + 15 * 0.005)
    # A price the SKUs do not give keeps its value.
    old = catalog.regions["us-central1"]
    assert prices.machines["n1-standard-4"][1] == old.machines["n1-standard-4"][1]
    assert prices.gpus["nvidia-tesla-t4"] == (old.gpus["nvidia-tesla-t4"][0], 0.111)
    assert prices.gpus["nvidia-l4"][0] == pytest.approx(0.6)
    assert repriced.regions["us-west1"] == catalog.regions["us-west1"]  # not asked for
    assert repriced.as_of and "Cloud Billing Catalog API" in repriced.source
    assert PriceCatalog.from_json(repriced.to_json()).regions == repriced.regions


def test_error_codes_classify_by_place() -> None:
    capacity = classify(["ZONE_RESOURCE_POOL_EXHAUSTED"], "no", region="r", zone="r-a")
    assert isinstance(capacity, CapacityError) and capacity.scope == "zone"
    wording = classify(
        [], "The zone does not have enough resources available", region="r", zone="r-a"
    )
    assert isinstance(wording, CapacityError)
    quota = classify(["QUOTA_EXCEEDED"], "Quota 'CPUS' exceeded", region="r", zone="r-a")
    assert isinstance(quota, QuotaError) and quota.scope == "region" and quota.region == "r"
    assert classify(["INVALID_FIELD_VALUE"], "bad", region="r", zone="r-a") is None


def test_labels_and_names_fit_gce_rules() -> None:
    labels = to_labels({"gpulayer:owner": "o-abc", "Team:Name": "ML Infra/2"})
    assert labels == {"gpulayer-owner": "o-abc", "team-name": "ml-infra-2"}
    assert from_labels({"gpulayer-job": "j-1"}) == {"gpulayer:job": "j-1"}
    assert label_filter({"gpulayer:job": "j-1"}) == '(labels.gpulayer-job = "j-1")'
    assert resource_name("r-abc123") == "gpulayer-r-abc123"
    assert resource_name("R_Mixed.Case") == "gpulayer-r-mixed-case"
    assert len(resource_name("r" * 64)) <= 63


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"regions": ["us_central"]}, "regions"),
        ({"zones": ["europe-west4-a"]}, "zones"),
        ({"image": {"family": "x"}}, "image"),
        ({"image": {"project": "p", "family": "f", "arch": "x"}}, "image"),
        ({"ssh_user": "Root User"}, "ssh_user"),
        ({"offers_source": "guess"}, "offers_source"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_bad_settings_name_their_field(settings: dict[str, Any], field: str) -> None:
    with pytest.raises(ProviderSettingsError, match=field):
        load_settings(GcpSettings, settings, provider="gcp")


def test_the_plugin_and_its_catalog_offers_import_no_google_client() -> None:
    script = (
        "import json, sys\n"
        "import gpulayer.cli.app\n"
        "from gpulayer.cloud.registry import get_provider\n"
        "from gpulayer.cloud.offer import OfferQuery\n"
        "p = get_provider('gcp', {})\n"
        "n = len(p.catalog_offers(OfferQuery(accelerator='cuda')))\n"
        "print(json.dumps({'offers': n, 'google': sorted(m for m in sys.modules\n"
        "  if m.startswith('google.cloud') or m.startswith('google.auth'))}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    seen = json.loads(out)
    assert seen["offers"] > 0
    assert seen["google"] == []
