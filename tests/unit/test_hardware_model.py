"""Offers and hosts described by hand share one hardware model: the same fields, the same
checks, errors that name what they check."""

from __future__ import annotations

import pytest
from gpulayer_ssh import HostHardware
from pydantic import ValidationError

from gpulayer.cloud import Hardware, Offer

PLACE = {"provider": "aws", "instance_type": "g5.xlarge", "region": "us-east-1"}


def test_offers_and_hosts_have_the_hardware_fields_and_an_offer_starts_with_its_place() -> None:
    assert list(HostHardware.model_fields) == list(Hardware.model_fields)
    fields = list(Offer.model_fields)
    assert fields[: len(PLACE)] == list(PLACE)
    assert [f for f in fields if f in Hardware.model_fields] == list(Hardware.model_fields)
    offer = Offer(**PLACE, cpu_cores=4, accelerator="cuda", gpu_count=1)
    assert list(offer.model_dump())[:5] == ["provider", "instance_type", "region", "zone", "zones"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cpu_cores": 4, "gpu_count": 2}, "gpu_count: a cpu {noun} has no GPUs"),
        ({"cpu_cores": 4, "accelerator": "cuda"}, "gpu_count: a cuda {noun} needs at least 1 GPU"),
        ({"cpu_cores": 4, "cpu_arch": "sparc"}, "unknown cpu_arch 'sparc'"),
        ({"cpu_cores": 4, "os": "plan9"}, "unknown os 'plan9'"),
        ({"cpu_cores": 0}, "greater than 0"),
        ({"cpu_cores": 4, "cuda_compute_capability": "8"}, "not of the form major.minor"),
        ({"cpu_cores": float("inf")}, "finite number"),
    ],
)
def test_both_refuse_the_same_hardware_in_their_own_words(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ValidationError, match=message.format(noun="host")):
        HostHardware.model_validate(fields)
    with pytest.raises(ValidationError, match=message.format(noun="offer")):
        Offer.model_validate(PLACE | fields)


def test_host_hardware_reads_arch_aliases_as_offers_do() -> None:
    host = HostHardware(cpu_cores=8, cpu_arch="arm64", os="Linux")
    assert (host.cpu_arch, host.os) == ("aarch64", "linux")
    offer = Offer(**PLACE, **host.model_dump())
    assert offer.model_dump(include=set(Hardware.model_fields)) == host.model_dump()
