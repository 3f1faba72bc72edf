"""The AWS provider's pure parts: parsing EC2 and price-list answers, building offers,
choosing images, translating error codes, settings and the price catalog."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError, NoCredentialsError
from gpulayer_aws import AwsProvider
from gpulayer_aws.catalog import PriceCatalog, load_catalog, save_catalog, shipped_catalog
from gpulayer_aws.errors import translate
from gpulayer_aws.images import newest
from gpulayer_aws.instances import to_instance
from gpulayer_aws.offers import build_offers
from gpulayer_aws.pricing import parse_price_item
from gpulayer_aws.shapes import Shape, shape_from_api

from gpulayer.cloud.errors import (
    AuthError,
    CapacityError,
    ImageNotFoundError,
    ProviderError,
    ProviderSettingsError,
    QuotaError,
    ScopedProviderError,
)


def _type(name: str, vcpus: int, mib: int, arch: str = "x86_64", gpus: Any = None) -> dict:
    item: dict[str, Any] = {
        "InstanceType": name,
        "VCpuInfo": {"DefaultVCpus": vcpus},
        "MemoryInfo": {"SizeInMiB": mib},
        "ProcessorInfo": {"SupportedArchitectures": [arch]},
    }
    if gpus is not None:
        item["GpuInfo"] = {"Gpus": gpus}
    return item


def _gpu(name: str, count: int, mib: int, maker: str = "NVIDIA") -> dict[str, Any]:
    return {"Name": name, "Manufacturer": maker, "Count": count, "MemoryInfo": {"SizeInMiB": mib}}


def test_shapes_from_describe_instance_types() -> None:
    p4d = shape_from_api(_type("p4d.24xlarge", 96, 1179648, gpus=[_gpu("A100", 8, 40960)]))
    assert p4d == Shape("p4d.24xlarge", 96, 1152.0, "x86_64", "A100", "NVIDIA", 8, 40.0)
    assert p4d.nvidia
    g5g = shape_from_api(_type("g5g.xlarge", 4, 8192, "arm64", [_gpu("T4g", 1, 16384)]))
    assert g5g is not None and g5g.cpu_arch == "aarch64"
    m6i = shape_from_api(_type("m6i.large", 2, 8192))
    assert m6i == Shape("m6i.large", 2, 8.0, "x86_64")
    amd = shape_from_api(_type("g4ad.xlarge", 4, 16384, gpus=[_gpu("V520", 1, 8192, "AMD")]))
    assert amd is not None and not amd.nvidia
    # A slice of one GPU is no whole GPU (Count 0) but one device holding that part of it.
    part = {**_gpu("L4", 0, 2861), "GpuPartitionSize": 0.125, "LogicalGpuCount": 1}
    g6f = shape_from_api(_type("g6f.large", 2, 8192, gpus=[part]))
    assert g6f == Shape("g6f.large", 2, 8.0, "x86_64", "L4", "NVIDIA", 1, 2.79, 0.125)
    whole = {**_gpu("L4", 1, 22888), "GpuPartitionSize": 1.0, "LogicalGpuCount": 1}
    g6 = shape_from_api(_type("g6.xlarge", 4, 16384, gpus=[whole]))
    assert g6 is not None and (g6.gpu_count, g6.gpu_slice) == (1, None)
    # Mac hosts are not offered.
    assert shape_from_api(_type("mac2.metal", 8, 16384, "arm64_mac")) is None
    assert Shape.from_json(p4d.to_json()) == p4d


def _price_doc(unit: str = "Hrs", usd: str | None = "1.0060000000") -> dict[str, Any]:
    dims: dict[str, Any] = {"unit": unit, "pricePerUnit": {"USD": usd} if usd else {}}
    return {
        "product": {"attributes": {"instanceType": "g5.xlarge", "regionCode": "us-east-1"}},
        "terms": {"OnDemand": {"T1": {"priceDimensions": {"D1": dims}}}},
    }


def test_price_list_items() -> None:
    assert parse_price_item(json.dumps(_price_doc())) == ("g5.xlarge", "us-east-1", 1.006)
    assert parse_price_item(_price_doc(unit="Quantity")) is None
    assert parse_price_item(_price_doc(usd=None)) is None
    assert parse_price_item(_price_doc(usd="0.0000000000")) is None
    assert parse_price_item({"product": {"attributes": {}}, "terms": {}}) is None


def test_build_offers_markets_zones_and_prices() -> None:
    shapes = [
        Shape("g5.xlarge", 4, 16.0, "x86_64", "A10G", "NVIDIA", 1, 22.35),
        Shape("g4ad.xlarge", 4, 16.0, "x86_64", "V520", "AMD", 1, 8.0),
        Shape("p9.huge", 64, 512.0, "x86_64", "Z900", "NVIDIA", 8, None),
        Shape("m6i.large", 2, 8.0, "x86_64"),
        Shape("m9.large", 2, 8.0, "x86_64"),
    ]
    zones = {
        "g5.xlarge": ["us-east-1a", "us-east-1b"],
        "p9.huge": ["us-east-1a"],
        "m6i.large": ["us-east-1a"],
        "m9.large": ["us-east-1a"],
    }
    on_demand = {"g5.xlarge": 1.006, "m6i.large": 0.096}
    spot = {"g5.xlarge": {"us-east-1a": 0.4}}
    common: dict[str, Any] = {"region": "us-east-1", "accelerator": "cuda"}

    offers = build_offers(shapes, zones, on_demand, spot, allow_spot=True, **common)
    labels = {(o.label, o.hourly_price) for o in offers}
    assert labels == {
        ("aws/us-east-1a/g5.xlarge", 1.006),
        ("aws/us-east-1a/g5.xlarge (spot)", 0.4),
        ("aws/us-east-1b/g5.xlarge", 1.006),
        ("aws/us-east-1a/p9.huge", None),
    }
    g5 = next(o for o in offers if o.instance_type == "g5.xlarge")
    assert (g5.gpu_memory_gb, g5.cuda_compute_capability) == (22.35, "8.6")
    unknown = next(o for o in offers if o.instance_type == "p9.huge")
    assert (unknown.cuda_compute_capability, unknown.gpu_memory_gb) == (None, None)

    no_spot = build_offers(shapes, zones, on_demand, spot, allow_spot=False, **common)
    assert not any(o.spot for o in no_spot)
    only_b = build_offers(
        shapes, zones, on_demand, spot, allow_spot=True, allowed_zones={"us-east-1b"}, **common
    )
    assert {o.zone for o in only_b} == {"us-east-1b"}
    cpu = build_offers(
        shapes, zones, on_demand, spot, region="us-east-1", accelerator="cpu", allow_spot=False
    )
    assert [(o.instance_type, o.accelerator) for o in cpu] == [("m6i.large", "cpu")]


def test_newest_image() -> None:
    images = [
        {"ImageId": "ami-1", "Name": "a-2024", "CreationDate": "2024-05-01T00:00:00.000Z"},
        {"ImageId": "ami-3", "Name": "a-2025", "CreationDate": "2025-01-01T00:00:00.000Z"},
        {"ImageId": "ami-2", "Name": "a-2023", "CreationDate": "2023-01-01T00:00:00.000Z"},
    ]
    assert newest(images)["ImageId"] == "ami-3"  # type: ignore[index]
    same_second = [{**i, "CreationDate": "2025-01-01T00:00:00.000Z"} for i in images]
    assert newest(same_second)["ImageId"] == "ami-3"  # type: ignore[index]
    assert newest([]) is None


def _client_error(code: str, message: str = "something") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}}, "RunInstances")


@pytest.mark.parametrize(
    ("code", "kind", "scope"),
    [
        ("InsufficientInstanceCapacity", CapacityError, "zone"),
        ("Unsupported", CapacityError, "zone"),
        ("VcpuLimitExceeded", QuotaError, "region"),
        ("InstanceLimitExceeded", QuotaError, "region"),
        ("MaxSpotInstanceCountExceeded", QuotaError, "region"),
        ("AuthFailure", AuthError, "provider"),
        ("UnauthorizedOperation", AuthError, "provider"),
    ],
)
def test_error_codes_become_scoped_errors(code: str, kind: type, scope: str) -> None:
    error = translate(_client_error(code), region="us-east-1", zone="us-east-1a")
    assert isinstance(error, kind)
    assert isinstance(error, ScopedProviderError) and error.scope == scope
    assert code in str(error)


def test_other_failures() -> None:
    missing = translate(NoCredentialsError())
    assert isinstance(missing, AuthError) and "no AWS credentials found" in str(missing)
    image = translate(_client_error("InvalidAMIID.NotFound"))
    assert isinstance(image, ImageNotFoundError)
    other = translate(_client_error("InvalidParameterValue", "bad\n value"))
    assert type(other) is ProviderError and str(other) == "aws: InvalidParameterValue: bad value"
    plain = ValueError("not ours")
    assert translate(plain) is plain


def test_instance_states_and_addresses() -> None:
    raw = {
        "InstanceId": "i-1",
        "InstanceType": "g5.xlarge",
        "State": {"Name": "shutting-down"},
        "Placement": {"AvailabilityZone": "us-east-1a"},
        "PublicIpAddress": "54.0.0.1",
        "PrivateIpAddress": "10.0.0.1",
        "InstanceLifecycle": "spot",
        "LaunchTime": datetime(2025, 1, 1, tzinfo=timezone.utc),
        "Tags": [
            {"Key": "gpulayer:hourly-price", "Value": "0.4"},
            {"Key": "gpulayer:ssh-user", "Value": "ec2-user"},
        ],
    }
    public = to_instance(raw, "us-east-1", use_private_ip=False)
    assert (public.state, public.ssh_host, public.ssh_user) == ("stopping", "54.0.0.1", "ec2-user")
    assert (public.spot, public.hourly_price, public.live) == (True, 0.4, False)
    private = to_instance(raw, "us-east-1", use_private_ip=True)
    assert private.ssh_host == "10.0.0.1"
    odd = to_instance(
        {**raw, "State": {"Name": "rebooting"}, "Tags": []}, "us-east-1", use_private_ip=False
    )
    assert (odd.state, odd.hourly_price, odd.ssh_user) == ("unknown", None, "ubuntu")


def test_settings_errors_name_the_field() -> None:
    with pytest.raises(ProviderSettingsError, match="regions: 'Virginia' is not an AWS region"):
        AwsProvider({"regions": ["Virginia"]})
    with pytest.raises(ProviderSettingsError, match="colour: unknown setting"):
        AwsProvider({"colour": "blue"})
    with pytest.raises(ProviderSettingsError, match="poll_seconds"):
        AwsProvider({"poll_seconds": 0})
    assert AwsProvider({"regions": ["eu-west-1", "eu-west-1"]}).settings.regions == ["eu-west-1"]


def test_shipped_catalog_prices_common_gpu_types() -> None:
    catalog = shipped_catalog()
    for name in ("p3.2xlarge", "p4d.24xlarge", "p5.48xlarge", "g4dn.xlarge", "g5.xlarge"):
        assert catalog.on_demand[name]["us-east-1"] > 0
    for name in ("g6.xlarge", "g6e.xlarge", "m6i.large"):
        assert set(catalog.on_demand[name]) >= {"us-east-1", "us-east-2", "us-west-2"}
    assert set(catalog.on_demand["g5g.xlarge"]) >= {"us-east-1", "us-west-2"}
    # A bigger size of a family never costs less per GPU than the smallest.
    assert (
        catalog.on_demand["g5.48xlarge"]["us-east-1"] / 8
        >= (catalog.on_demand["g5.xlarge"]["us-east-1"])
    )
    assert catalog.currency == "USD" and catalog.as_of


def test_refreshed_catalog_wins_and_a_broken_one_is_ignored(tmp_path: Path) -> None:
    assert load_catalog(tmp_path) == shipped_catalog()
    mine = PriceCatalog(on_demand={"g5.xlarge": {"us-east-1": 0.5}}, as_of="2030-01-01")
    path = save_catalog(mine, tmp_path)
    assert load_catalog(tmp_path) == mine
    assert load_catalog(tmp_path).region("us-east-1") == {"g5.xlarge": 0.5}
    path.write_text("{not json")
    assert load_catalog(tmp_path) == shipped_catalog()
