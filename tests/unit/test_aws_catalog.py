"""The AWS catalog shipped with the plugin, held against the public price facts it was built
from, and its rebuild from AWS's public bulk price list (a local HTTP server stands in for
pricing.us-east-1.amazonaws.com)."""

from __future__ import annotations

import csv
import io
import json
import threading
from collections.abc import Iterator
from datetime import date
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from gpulayer_aws import AwsProvider
from gpulayer_aws.catalog import refresh_catalog, shipped_catalog
from gpulayer_aws.families import GPU_FAMILIES, family_of

from gpulayer.cloud.errors import ProviderError
from gpulayer.cloud.offer import OfferQuery
from gpulayer.cloud.ranking import filter_offers
from tests.support.cli import run_cli

# On-demand USD/h, Linux, shared tenancy, from the source the catalog records
# (skypilot-org/skypilot-catalog catalogs/v8/aws/vms.csv at 00148f2, read 2026-12-01).
PRICE_FACTS = [
    ("p4d.24xlarge", "us-east-1", 21.957642),
    ("p4de.24xlarge", "us-east-1", 27.44705),
    ("p5.48xlarge", "us-east-1", 55.04),
    ("p5.4xlarge", "us-east-1", 6.88),
    ("p5en.48xlarge", "us-east-1", 63.296),
    ("p6-b200.48xlarge", "us-east-1", 113.9328),
    ("p6-b300.48xlarge", "us-west-2", 142.416),
    ("p3.2xlarge", "us-east-1", 3.06),
    ("g4dn.xlarge", "us-east-1", 0.526),
    ("g5.xlarge", "us-east-1", 1.006),
    ("g5.48xlarge", "eu-central-1", 20.3681),
    ("g5g.xlarge", "us-west-2", 0.42),
    ("g6.xlarge", "us-east-1", 0.8048),
    ("g6.48xlarge", "ap-northeast-1", 19.36206),
    ("g6e.xlarge", "us-east-1", 1.861),
    ("g6e.12xlarge", "eu-north-1", 11.12975),
    ("g7e.2xlarge", "us-east-1", 3.36312),
    ("g7e.4xlarge", "us-east-1", 3.99816),
    ("g7e.48xlarge", "us-east-2", 33.14432),
    ("gr6.4xlarge", "us-east-1", 1.5392),
    ("gr6.8xlarge", "eu-west-3", 3.10536),
]
# (type, GPU model, count, vCPUs, RAM GB, architecture)
HARDWARE_FACTS = [
    ("p4d.24xlarge", "A100", 8, 96, 1152, "x86_64"),
    ("p5.4xlarge", "H100", 1, 16, 256, "x86_64"),
    ("p6-b200.48xlarge", "B200", 8, 192, 2048, "x86_64"),
    ("g5g.xlarge", "T4g", 1, 4, 8, "aarch64"),
    ("g6e.xlarge", "L40S", 1, 4, 32, "x86_64"),
    ("g7e.4xlarge", "RTX PRO Server 6000", 1, 16, 128, "x86_64"),
    ("g7e.48xlarge", "RTX PRO Server 6000", 8, 192, 2048, "x86_64"),
    ("gr6.8xlarge", "L4", 1, 32, 256, "x86_64"),
]
# The US, EU and Asia regions SkyPilot lists for AWS GPUs; each has the common GPU types.
REGIONS = [
    "us-east-1", "us-east-2", "us-west-2", "ca-central-1", "eu-central-1", "eu-west-1",
    "eu-west-2", "eu-north-1", "ap-northeast-1", "ap-northeast-2", "ap-south-1",
    "ap-southeast-2",
]  # fmt: skip


@pytest.mark.parametrize(("name", "region", "price"), PRICE_FACTS)
def test_shipped_prices_are_the_facts_they_were_built_from(
    name: str, region: str, price: float
) -> None:
    assert shipped_catalog().on_demand[name][region] == price


@pytest.mark.parametrize(("name", "gpu", "count", "vcpus", "memory", "arch"), HARDWARE_FACTS)
def test_shipped_hardware(name: str, gpu: str, count: int, vcpus: int, memory: float, arch: str):
    shape = shipped_catalog().hardware[name]
    assert (shape.gpu_name, shape.gpu_count, shape.vcpus, shape.memory_gb, shape.cpu_arch) == (
        gpu,
        count,
        vcpus,
        memory,
        arch,
    )


def test_catalog_covers_gpu_types_and_regions_and_says_where_prices_came_from() -> None:
    catalog = shipped_catalog()
    assert set(catalog.on_demand) <= set(catalog.hardware)
    gpu_types = {n for n, s in catalog.hardware.items() if s.gpu_count}
    for name in gpu_types:
        assert GPU_FAMILIES[family_of(name)][0] == catalog.hardware[name].gpu_name
    for family in ("g4dn", "g5", "g5g", "g6", "g6e", "p3", "p4d", "p4de", "p5", "p5en"):
        assert any(family_of(n) == family for n in catalog.on_demand)
    for region in REGIONS:
        present = {family_of(n) for n, prices in catalog.on_demand.items() if region in prices}
        assert {"g4dn", "g5"} <= present or {"g4dn", "g6"} <= present, region
    assert "p5e.48xlarge" in catalog.zones and "p5e.48xlarge" not in catalog.on_demand
    assert (
        catalog.spot["p4d.24xlarge"]["us-east-1"] < catalog.on_demand["p4d.24xlarge"]["us-east-1"]
    )
    assert date.fromisoformat(catalog.as_of) and catalog.price_sources["gpu"].startswith("https://")


def test_added_families_say_where_their_prices_came_from() -> None:
    catalog = shipped_catalog()
    for family in ("g7e", "gr6"):
        source = catalog.price_sources[family]
        assert "skypilot-catalog/blob/00148f2af3672e2229b4f7bf8157d5a3f36e3c35" in source
        types = [n for n in catalog.on_demand if family_of(n) == family]
        assert types, family
        for name in types:
            for region, price in catalog.on_demand[name].items():
                assert 0 < catalog.spot[name][region] < price, (name, region)
                assert catalog.zones[name][region], (name, region)
    assert "g6f" in catalog.price_sources


# (type, part of one L4, MiB of GPU memory, vCPUs, RAM GB, us-east-1 on-demand USD/h), from the
# sources the catalog records for g6f: SkyPilot's catalog at e385a0d, Karpenter's generated
# price table at 6fc13b5, AWS's ECS guide for the parts.
SLICE_FACTS = [
    ("g6f.large", 0.125, 2861, 2, 8, 0.202),
    ("g6f.xlarge", 0.125, 2861, 4, 16, 0.2375),
    ("g6f.2xlarge", 0.25, 5722, 8, 32, 0.475),
    ("g6f.4xlarge", 0.5, 11444, 16, 64, 0.95),
    ("gr6f.4xlarge", 0.5, 11444, 16, 128, 1.066),
]


@pytest.mark.parametrize(("name", "part", "mib", "vcpus", "memory", "price"), SLICE_FACTS)
def test_slices_of_an_l4_are_the_facts_they_were_built_from(
    name: str, part: float, mib: int, vcpus: int, memory: float, price: float
) -> None:
    catalog = shipped_catalog()
    shape = catalog.hardware[name]
    assert (shape.gpu_name, shape.gpu_count, shape.gpu_slice) == ("L4", 1, part)
    assert (shape.gpu_memory_gb, shape.vcpus, shape.memory_gb) == (
        round(mib / 1024, 2),
        vcpus,
        memory,
    )
    assert catalog.on_demand[name]["us-east-1"] == price
    assert "e385a0d348eda9cefd9806423e7725944dc249e4" in catalog.price_sources["g6f"]


def test_a_slice_of_a_gpu_is_rented_only_to_a_job_that_accepts_one() -> None:
    provider = AwsProvider({"regions": ["us-east-1"]})
    whole = OfferQuery(accelerator="cuda", gpu_count=1, gpu_models=("L4",))
    fitting, rejected = filter_offers(provider.catalog_offers(whole), whole)
    assert fitting[0].instance_type == "g6.xlarge"
    assert all(o.gpu_slice is None for o in fitting)
    assert rejected["gpu_slices: a slice of one GPU (resources.gpu_slices accepts it)"] == 5
    sliced = whole.model_copy(update={"gpu_slices": True})
    offers = filter_offers(provider.catalog_offers(sliced), sliced).offers
    assert (offers[0].instance_type, offers[0].gpu_slice, offers[0].hourly_price) == (
        "g6f.large",
        0.125,
        0.202,
    )
    # A slice holds its part's memory, so a job naming 4 GB of GPU memory skips the 1/8 ones.
    roomy = sliced.model_copy(update={"gpu_memory_gb": 4})
    first = filter_offers(provider.catalog_offers(roomy), roomy).offers[0]
    assert (first.instance_type, first.gpu_memory_gb) == ("g6f.2xlarge", 5.59)


def test_an_rtx_pro_6000_job_rents_the_smallest_g7e() -> None:
    query = OfferQuery(accelerator="cuda", gpu_count=1, gpu_models=("RTX PRO 6000",))
    offers = AwsProvider({"regions": ["us-east-1"]}).catalog_offers(query)
    first = filter_offers(offers, query).offers[0]
    assert (first.instance_type, first.hourly_price, first.gpu_memory_gb) == (
        "g7e.2xlarge",
        3.36312,
        96.0,
    )


def test_catalog_offers_need_no_credentials_or_network() -> None:
    provider = AwsProvider({"regions": ["us-east-1"]})
    query = OfferQuery(accelerator="cuda", gpu_name="H100", gpu_count_exact=False)
    here = filter_offers(provider.catalog_offers(query), query).offers
    assert {(o.instance_type, o.region, o.spot) for o in here} == {
        ("p5.48xlarge", "us-east-1", False),
        ("p5.4xlarge", "us-east-1", False),
    }  # no spot: the settings do not allow it
    everywhere = filter_offers(provider.catalog_offers(query, everywhere=True), query).offers
    assert len({o.region for o in everywhere}) >= 8 and not any(o.spot for o in everywhere)
    spot_allowed = AwsProvider({"regions": ["us-east-1"], "allow_spot": True})
    both = filter_offers(spot_allowed.catalog_offers(query, everywhere=True), query).offers
    assert any(o.spot for o in both) and any(not o.spot for o in both)
    one = next(o for o in here if o.instance_type == "p5.4xlarge")
    assert (one.gpu_count, one.hourly_price, one.zone) == (1, 6.88, None) and one.zones
    assert provider.catalog_info().as_of == shipped_catalog().as_of


# --- rebuilding from the public bulk price list ----------------------------------------------

HEADER = [
    "SKU", "OfferTermCode", "RateCode", "TermType", "PriceDescription", "Unit", "PricePerUnit",
    "Currency", "Product Family", "Instance Type", "vCPU", "Physical Processor", "Memory",
    "GPU", "GPU Memory", "Tenancy", "Operating System", "License Model", "CapacityStatus",
    "Pre Installed S/W", "Region Code",
]  # fmt: skip


def _row(name: str, price: str, **changes: str) -> list[str]:
    fields = {
        "SKU": f"SKU-{name}",
        "OfferTermCode": "JRTCKXETXF",
        "RateCode": f"SKU-{name}.JRTCKXETXF.6YS6EN2CT7",
        "TermType": "OnDemand",
        "PriceDescription": f"${price} per On Demand Linux {name} Instance Hour",
        "Unit": "Hrs",
        "PricePerUnit": price,
        "Currency": "USD",
        "Product Family": "Compute Instance",
        "Instance Type": name,
        "vCPU": "4",
        "Physical Processor": "AMD EPYC 7R32",
        "Memory": "16 GiB",
        "GPU": "1",
        "GPU Memory": "24 GiB",
        "Tenancy": "Shared",
        "Operating System": "Linux",
        "License Model": "No License required",
        "CapacityStatus": "Used",
        "Pre Installed S/W": "NA",
        "Region Code": "us-east-1",
        **changes,
    }
    return [fields[h] for h in HEADER]


PRICE_LIST = [
    _row("g5.xlarge", "0.9500000000"),
    _row("g5.xlarge", "1.8000000000", **{"Operating System": "Windows"}),
    _row("g5.xlarge", "0.6000000000", TermType="Reserved"),
    _row("g5.xlarge", "0.0000000000", CapacityStatus="UnusedCapacityReservation"),
    _row(
        "p5.4xlarge",
        "6.5000000000",
        **{"vCPU": "16", "Memory": "256 GiB", "GPU Memory": "80 GB", "Physical Processor": "AMD"},
    ),
    _row("g5g.xlarge", "0.4100000000", **{"Physical Processor": "AWS Graviton2 Processor"}),
    _row("m6i.large", "0.0900000000", **{"GPU": "NA", "GPU Memory": "NA", "Memory": "8 GiB"}),
    _row("r7iz.large", "0.1860000000", **{"GPU": "NA", "GPU Memory": "NA"}),
    _row("g6f.large", "0.2020000000", **{"vCPU": "2", "Memory": "8 GiB", "GPU": "0.125"}),
]


def _csv(rows: list[list[str]]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL)
    for meta in (["FormatVersion", "v1.0"], ["Disclaimer", "test"], ["OfferCode", "AmazonEC2"]):
        writer.writerow(meta)
    writer.writerow(HEADER)
    writer.writerows(rows)
    return out.getvalue().encode()


@pytest.fixture
def price_list_server() -> Iterator[tuple[str, list[str]]]:
    asked: list[str] = []
    body = _csv(PRICE_LIST)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            if self.path != "/offers/v1.0/aws/AmazonEC2/current/us-east-1/index.csv":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


def test_refresh_from_the_bulk_price_list(
    price_list_server: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, asked = price_list_server
    settings = {"price_list_url": url, "cache_dir": str(tmp_path)}
    written = refresh_catalog(settings, regions=["us-east-1"], source="bulk")
    assert asked == ["/offers/v1.0/aws/AmazonEC2/current/us-east-1/index.csv"]
    data = json.loads(written.read_text())
    shipped = shipped_catalog()
    kept = {r: p for r, p in shipped.on_demand["g5.xlarge"].items() if r != "us-east-1"}
    assert data["on_demand"]["g5.xlarge"] == {"us-east-1": 0.95, **kept}
    assert data["on_demand"]["m6i.large"]["us-east-1"] == 0.09
    assert "r7iz.large" not in data["on_demand"]  # a CPU type the catalog does not carry
    p5 = data["hardware"]["p5.4xlarge"]
    assert (p5["gpu_name"], p5["gpu_count"], p5["gpu_memory_gb"], p5["vcpus"]) == (
        "H100",
        1,
        80,
        16,
    )
    assert data["hardware"]["g5g.xlarge"]["cpu_arch"] == "aarch64"
    # The price list names a slice of one GPU by its part ("0.125"); given the whole GPU's
    # memory, the slice holds its part of it.
    g6f = data["hardware"]["g6f.large"]
    assert (g6f["gpu_count"], g6f["gpu_slice"], g6f["gpu_memory_gb"]) == (1, 0.125, 3.0)
    assert data["on_demand"]["g6f.large"]["us-east-1"] == 0.202
    assert data["on_demand"]["p4d.24xlarge"] == {
        r: p for r, p in shipped.on_demand["p4d.24xlarge"].items() if r != "us-east-1"
    }
    assert url in data["price_sources"]["on_demand"] and data["as_of"] == date.today().isoformat()
    offers = AwsProvider(settings).catalog_offers(OfferQuery(accelerator="cuda", gpu_name="A10G"))
    assert {o.hourly_price for o in offers if o.instance_type == "g5.xlarge"} == {0.95}
    with pytest.raises(ProviderError, match=r"eu-west-1/index\.csv"):
        refresh_catalog(settings, regions=["eu-west-1"], source="bulk")


def test_catalog_refresh_command(price_list_server: tuple[str, list[str]], tmp_path: Path) -> None:
    from gpulayer.control.paths import home

    url, _ = price_list_server
    root = home().ensure().root
    cache = tmp_path / "aws-cache"
    (root / "providers.yaml").write_text(f"aws:\n  price_list_url: {url}\n  cache_dir: {cache}\n")
    result = run_cli(["catalog", "refresh", "aws", "--region", "us-east-1"], timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"catalog written to {cache / 'price_catalog.json'}" in result.stdout
    bad = run_cli(["catalog", "refresh", "aws", "--source", "web"])
    assert bad.returncode == 2 and "--source: bulk or api" in bad.stderr


# Memory per vCPU of the general-purpose families the catalog lists (c: compute, m: general,
# r: memory), as AWS documents them for the 6th generation.
_GIB_PER_VCPU = {"c6i": 2, "m6i": 4, "r6i": 8}


def test_cpu_rows_have_their_familys_memory() -> None:
    rows = shipped_catalog().hardware
    checked = 0
    for name, shape in rows.items():
        family = name.split(".")[0]
        if family in _GIB_PER_VCPU:
            assert shape.memory_gb == shape.vcpus * _GIB_PER_VCPU[family], name
            checked += 1
    assert checked >= 10
