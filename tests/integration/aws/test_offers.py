"""Offers from moto's EC2: GPU types, zones, prices, spot, caching, the Pricing API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpulayer_aws import AwsProvider, refresh_catalog
from gpulayer_aws.catalog import shipped_catalog

from gpulayer.cloud.offer import OfferQuery
from gpulayer.cloud.ranking import filter_offers
from gpulayer.hardware.gpus import cuda_capability

from .conftest import Moto

GPU = OfferQuery(accelerator="cuda")


def _gpu_types_in_moto(moto: Moto, region: str) -> dict[str, dict[str, Any]]:
    types = moto.ec2(region).describe_instance_types()["InstanceTypes"]
    return {t["InstanceType"]: t for t in types if "GpuInfo" in t}


def _zones_in_moto(moto: Moto, region: str, instance_type: str) -> set[str]:
    offerings = moto.ec2(region).describe_instance_type_offerings(
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": [instance_type]}],
    )["InstanceTypeOfferings"]
    return {o["Location"] for o in offerings}


def test_gpu_offers_are_nvidia_types_in_their_zones(moto: Moto, provider: AwsProvider) -> None:
    offers = provider.offers(GPU)
    by_type: dict[str, set[str]] = {}
    for offer in offers:
        by_type.setdefault(offer.instance_type, set()).add(offer.zone or "")
    moto_gpus = _gpu_types_in_moto(moto, "us-east-1")
    nvidia = {
        name for name, t in moto_gpus.items() if t["GpuInfo"]["Gpus"][0]["Manufacturer"] == "NVIDIA"
    }
    assert set(by_type) <= nvidia
    assert {"g5.xlarge", "p4d.24xlarge", "p5.48xlarge", "g6e.xlarge"} <= set(by_type)
    # AMD (g4ad) and Gaudi (dl1) are not CUDA offers.
    assert not any(name.startswith(("g4ad.", "dl1.")) for name in by_type)
    # A slice of one L4 (EC2 counts no whole GPU in it) is one GPU marked as a slice, which a
    # job gets only when it accepts slices; every other offer is of whole GPUs.
    parts = {o.instance_type: (o.gpu_count, o.gpu_slice) for o in offers if o.gpu_slice}
    assert parts["g6f.large"] == (1, 0.125) and parts["gr6f.4xlarge"] == (1, 0.5)
    assert set(parts) == {n for n in by_type if n.startswith(("g6f.", "gr6f."))}
    for name in ("g5.xlarge", "p5.48xlarge"):
        assert by_type[name] == _zones_in_moto(moto, "us-east-1", name)
    assert all(o.spot is False for o in offers)


def test_offer_hardware_and_prices(provider: AwsProvider) -> None:
    offers = {(o.instance_type, o.zone): o for o in provider.offers(GPU)}
    p4d = offers[("p4d.24xlarge", "us-east-1a")]
    assert (p4d.gpu_name, p4d.gpu_count, p4d.gpu_memory_gb) == ("A100", 8, 40.0)
    assert (p4d.cuda_compute_capability, p4d.cpu_cores, p4d.memory_gb) == ("8.0", 96, 1152.0)
    assert (p4d.accelerator, p4d.gpu_memory_kind, p4d.cpu_arch, p4d.os) == (
        "cuda",
        "dedicated",
        "x86_64",
        "linux",
    )
    catalog = shipped_catalog()
    assert p4d.hourly_price == catalog.on_demand["p4d.24xlarge"]["us-east-1"]
    g5g = next(o for (name, _), o in offers.items() if name == "g5g.xlarge")
    assert (g5g.cpu_arch, g5g.gpu_name, g5g.cuda_compute_capability) == ("aarch64", "T4g", "7.5")
    for offer in offers.values():
        assert offer.cuda_compute_capability == cuda_capability(offer.gpu_name)
        # A type the catalog prices only in other regions (moto 5.2.6 lists p6-b300 in
        # us-east-1; its price is published for us-west-2 alone) has no price here.
        priced = catalog.on_demand.get(offer.instance_type, {})
        assert offer.hourly_price == priced.get(offer.region), offer.instance_type


def test_offers_filtered_by_a_query(provider: AwsProvider) -> None:
    query = OfferQuery(
        accelerator="cuda", gpu_count=8, gpu_memory_gb=80, min_cuda_compute_capability="9.0"
    )
    result = filter_offers(provider.offers(query), query, max_hourly_cost=90)
    assert result.offers, result.rejected
    # Under the cap: p5 (H100), p5en (H200) and g7e.48xlarge (8 RTX PRO 6000, 96 GB each);
    # not p6-b200.
    assert {o.instance_type for o in result.offers} == {
        "p5.48xlarge",
        "p5en.48xlarge",
        "g7e.48xlarge",
    }
    prices = [o.hourly_price for o in result.offers]
    assert prices == sorted(prices) and all(p is not None and p <= 90 for p in prices)
    assert result.rejected["max_hourly_cost: above 90 USD/h"] > 0
    assert result.rejected["gpu_count: not exactly 8 GPUs"] > 0


def test_cpu_offers_only_priced_cpu_types(provider: AwsProvider) -> None:
    offers = provider.offers(OfferQuery(cpu_cores=2))
    catalog = shipped_catalog()
    names = {o.instance_type for o in offers}
    assert names and names <= set(catalog.on_demand)
    assert all(o.accelerator == "cpu" and o.gpu_count == 0 for o in offers)
    assert {"m6i.large", "c6i.xlarge", "t3.medium"} <= names
    assert provider.offers(OfferQuery(accelerator="mps")) == []


def test_spot_offers_priced_from_spot_history(moto: Moto, settings: dict[str, Any]) -> None:
    provider = AwsProvider({**settings, "allow_spot": True})
    offers = provider.offers(GPU)
    spot = [o for o in offers if o.spot]
    on_demand = [o for o in offers if not o.spot]
    assert spot and on_demand
    history = moto.ec2().describe_spot_price_history(
        InstanceTypes=["g5.xlarge"], ProductDescriptions=["Linux/UNIX"]
    )["SpotPriceHistory"]
    expected = {h["AvailabilityZone"]: float(h["SpotPrice"]) for h in history}
    g5_spot = {o.zone: o.hourly_price for o in spot if o.instance_type == "g5.xlarge"}
    assert g5_spot == expected
    only_on_demand = provider.offers(OfferQuery(accelerator="cuda", spot=False))
    assert not any(o.spot for o in only_on_demand)


def test_subnet_ids_limit_the_zones_offered(moto: Moto, settings: dict[str, Any]) -> None:
    subnet = moto.ec2().describe_subnets(
        Filters=[{"Name": "availability-zone", "Values": ["us-east-1b"]}]
    )["Subnets"][0]["SubnetId"]
    provider = AwsProvider({**settings, "subnet_ids": {"us-east-1b": subnet}})
    assert {o.zone for o in provider.offers(GPU)} == {"us-east-1b"}


def test_second_listing_comes_from_the_cache(
    moto: Moto, settings: dict[str, Any], tmp_path: Path
) -> None:
    fresh = {**settings, "cache_dir": str(tmp_path / "cache"), "allow_spot": True}
    first = AwsProvider(fresh).offers(GPU)
    asked = {c["Action"] for c in moto.calls()}
    assert {"DescribeInstanceTypes", "DescribeInstanceTypeOfferings"} <= asked
    assert "DescribeSpotPriceHistory" in asked
    before = len(moto.calls())
    second = AwsProvider(fresh).offers(GPU)
    assert second == first
    assert len(moto.calls()) == before


def _product(instance_type: str, region: str, usd: str, **attributes: str) -> dict[str, Any]:
    sku = f"SKU{abs(hash((instance_type, region, usd))) % 10**8}"
    attrs = {
        "instanceType": instance_type,
        "regionCode": region,
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
        "licenseModel": "No License required",
        **attributes,
    }
    return {
        "product": {"sku": sku, "productFamily": "Compute Instance", "attributes": attrs},
        "terms": {
            "OnDemand": {
                f"{sku}.JRTCKXETXF": {
                    "priceDimensions": {
                        f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                            "unit": "Hrs",
                            "pricePerUnit": {"USD": usd},
                        }
                    }
                }
            }
        },
    }


PRODUCTS = [
    _product("g5.xlarge", "us-east-1", "0.9000000000"),
    _product("g5.xlarge", "us-east-1", "4.0000000000", operatingSystem="Windows"),
    _product("g5.xlarge", "us-west-2", "0.9500000000"),
    _product("g6.xlarge", "us-east-1", "0.7000000000"),
    _product("m6i.large", "us-east-1", "0.0900000000"),
    _product("r7iz.large", "us-east-1", "0.1860000000"),
]


def test_prices_from_the_pricing_api(moto: Moto, settings: dict[str, Any], tmp_path: Path) -> None:
    moto.set_products(PRODUCTS)
    provider = AwsProvider(
        {**settings, "price_source": "api", "cache_dir": str(tmp_path / "cache")}
    )
    offers = {o.instance_type: o.hourly_price for o in provider.offers(GPU)}
    assert offers["g5.xlarge"] == 0.9
    assert offers["g6.xlarge"] == 0.7
    # Types the API did not price keep the catalog's price.
    assert offers["p4d.24xlarge"] == shipped_catalog().on_demand["p4d.24xlarge"]["us-east-1"]
    assert len(moto.calls("GetProducts")) == 1


def test_pricing_api_refusal_falls_back_to_the_catalog(
    moto: Moto, settings: dict[str, Any], tmp_path: Path
) -> None:
    moto.set_products(PRODUCTS)
    moto.fault("GetProducts", "AccessDeniedException", message="not allowed: pricing")
    provider = AwsProvider(
        {**settings, "price_source": "api", "cache_dir": str(tmp_path / "cache")}
    )
    offers = {o.instance_type: o.hourly_price for o in provider.offers(GPU)}
    assert offers["g5.xlarge"] == shipped_catalog().on_demand["g5.xlarge"]["us-east-1"]
    assert len(moto.calls("GetProducts")) == 1
    # The refusal is remembered for a while rather than asked again on every listing.
    provider.offers(GPU)
    assert len(moto.calls("GetProducts")) == 1


def test_refresh_catalog_writes_api_prices_that_offers_then_use(
    moto: Moto, settings: dict[str, Any], tmp_path: Path
) -> None:
    moto.set_products(PRODUCTS)
    cache = tmp_path / "cache"
    config = {**settings, "cache_dir": str(cache), "regions": ["us-east-1", "us-west-2"]}
    written = refresh_catalog(config)
    data = json.loads(written.read_text())
    assert written.parent == cache
    shipped = shipped_catalog().on_demand
    # Regions refreshed take the API's prices; the region not refreshed keeps its own.
    kept = {r: p for r, p in shipped["g5.xlarge"].items() if r not in ("us-east-1", "us-west-2")}
    assert "us-east-2" in kept
    assert data["on_demand"]["g5.xlarge"] == {"us-east-1": 0.9, "us-west-2": 0.95, **kept}
    assert data["on_demand"]["m6i.large"]["us-east-1"] == 0.09
    # A CPU type the shipped catalog does not list is not kept; untouched regions stay.
    assert "r7iz.large" not in data["on_demand"]
    assert data["on_demand"]["p4d.24xlarge"] == {
        r: p for r, p in shipped["p4d.24xlarge"].items() if r not in ("us-east-1", "us-west-2")
    }
    offers = AwsProvider(config).offers(OfferQuery(accelerator="cuda", regions=("us-west-2",)))
    assert {o.region for o in offers} == {"us-west-2"}
    assert {o.hourly_price for o in offers if o.instance_type == "g5.xlarge"} == {0.95}
