"""Offer and OfferQuery: validation and the mapping from a JobSpec."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpulayer.cloud.offer import Offer, OfferQuery, parse_capability
from gpulayer.spec.models import JobSpec


def _gpu_offer(**changes: object) -> Offer:
    fields: dict[str, object] = {
        "provider": "aws",
        "instance_type": "g5.xlarge",
        "region": "us-east-1",
        "zone": "us-east-1a",
        "accelerator": "cuda",
        "gpu_name": "A10G",
        "gpu_count": 1,
        "gpu_memory_gb": 22.4,
        "cuda_compute_capability": "8.6",
        "cpu_cores": 4,
        "memory_gb": 16,
        "hourly_price": 1.006,
    }
    fields.update(changes)
    return Offer.model_validate(fields)


def test_offer_is_frozen_and_hashable() -> None:
    offer = _gpu_offer()
    with pytest.raises(ValidationError):
        offer.hourly_price = 0.1  # type: ignore[misc]
    assert offer == _gpu_offer()
    assert len({offer, _gpu_offer()}) == 1


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"cuda_compute_capability": "8"}, "cuda_compute_capability"),
        ({"cpu_arch": "sparc"}, "cpu_arch"),
        ({"os": "plan9"}, "os"),
        ({"currency": "usd"}, "currency"),
        ({"hourly_price": -1}, "hourly_price"),
        ({"gpu_count": 0}, "gpu_count"),
        ({"accelerator": "cpu"}, "gpu_count"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_offer_rejects_bad_fields_naming_them(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        _gpu_offer(**changes)
    assert field in str(info.value)


def test_offer_normalizes_arch_and_os() -> None:
    offer = _gpu_offer(cpu_arch="arm64", os="Linux")
    assert (offer.cpu_arch, offer.os) == ("aarch64", "linux")


def test_offer_label_names_place_and_market() -> None:
    assert _gpu_offer().label == "aws/us-east-1a/g5.xlarge"
    assert _gpu_offer(spot=True, zone=None).label == "aws/us-east-1/g5.xlarge (spot)"


def test_capability_compares_numerically() -> None:
    assert parse_capability("10.0") > parse_capability("9.0")
    assert _gpu_offer(cuda_compute_capability="12.0").capability == (12, 0)


def test_query_defaults_one_gpu_for_gpu_accelerators() -> None:
    assert OfferQuery(accelerator="cuda").gpu_count == 1
    assert OfferQuery().gpu_count == 0
    with pytest.raises(ValidationError, match="gpu_count"):
        OfferQuery(accelerator="cpu", gpu_count=2)
    with pytest.raises(ValidationError, match="min_cuda_compute_capability"):
        OfferQuery(accelerator="cuda", min_cuda_compute_capability="eight")


def test_query_from_spec_carries_every_resource_need() -> None:
    spec = JobSpec.model_validate(
        {
            "workload": {"kind": "command", "command": ["python", "train.py"]},
            "resources": {
                "profile": "pytorch-cuda",
                "gpu_count": 2,
                "gpu_memory_gb": 40,
                "gpu_memory_kind": "dedicated",
                "min_cuda_compute_capability": "8.0",
                "cpu_cores": 8,
                "memory_gb": 64,
                "disk_gb": 200,
                "os": ["Linux"],
                "cpu_arch": ["amd64"],
            },
            "placement": {"target": "cloud", "regions": ["us-east-1", "us-west-2"]},
        }
    )
    query = OfferQuery.from_spec(spec, gpu_name="A100", spot=False)
    assert query.model_dump() == {
        "accelerator": "cuda",
        "gpu_count": 2,
        "gpu_memory_gb": 40,
        "gpu_memory_kind": "dedicated",
        "min_cuda_compute_capability": "8.0",
        "cpu_cores": 8,
        "memory_gb": 64,
        "disk_gb": 200,
        "os": ("linux",),
        "cpu_arch": ("x86_64",),
        "gpu_count_exact": True,
        "gpu_models": ("A100",),
        "spot": False,
        "gpu_slices": False,
            "regions": ("us-east-1", "us-west-2"),
    }


def test_query_from_cpu_spec() -> None:
    spec = JobSpec.model_validate({"workload": {"kind": "command", "command": ["true"]}})
    query = OfferQuery.from_spec(spec)
    assert (query.accelerator, query.gpu_count, query.cpu_cores, query.spot) == ("cpu", 0, 1, None)
