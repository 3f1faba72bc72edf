"""A gang's N instances from one run_instances against moto's EC2: together in one zone, in a
group that admits its own members, all or none, and torn down leaving nothing."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from gpulayer_aws import AwsProvider

from gpulayer.cloud.errors import CapacityError, ProviderError
from gpulayer.cloud.protocol import GangProvider, LaunchRequest

from .conftest import Moto
from .test_lifecycle import _offer, _ours

MakeRequest = Callable[..., LaunchRequest]


def test_a_gang_is_one_call_in_one_zone_whose_group_admits_itself(
    moto: Moto, provider: AwsProvider, make_request: MakeRequest
) -> None:
    assert isinstance(provider, GangProvider)
    offer = _offer(provider, "g5.xlarge", "us-east-1b")
    nodes = provider.launch_gang(offer, make_request("req-gang", count=2))

    assert len(nodes) == 2 and len({n.id for n in nodes}) == 2
    assert {n.zone for n in nodes} == {"us-east-1b"}
    assert {n.instance_type for n in nodes} == {"g5.xlarge"}
    calls = moto.calls("RunInstances")
    assert len(calls) == 1
    assert (calls[0]["MinCount"], calls[0]["MaxCount"]) == ("2", "2")
    held = _ours(moto, "req-gang")
    assert sorted(i["InstanceId"] for i in held["instances"]) == sorted(n.id for n in nodes)
    (group,) = held["security_groups"]
    rules = {p["IpProtocol"]: p for p in group["IpPermissions"]}
    # SSH from the controller only, and every port from the gang's own members.
    assert [r["CidrIp"] for r in rules["tcp"]["IpRanges"]] == ["203.0.113.7/32"]
    assert [g["GroupId"] for g in rules["-1"]["UserIdGroupPairs"]] == [group["GroupId"]]
    assert rules["-1"]["IpRanges"] == []

    again = AwsProvider(provider.settings).launch_gang(offer, make_request("req-gang", count=2))
    assert [n.id for n in again] == [n.id for n in nodes]  # idempotent by request id
    assert len(moto.calls("RunInstances")) == 1

    provider.terminate([n.id for n in nodes])
    assert _ours(moto, "req-gang") == {"instances": [], "key_pairs": [], "security_groups": []}


def test_a_refused_gang_leaves_nothing(
    moto: Moto, provider: AwsProvider, make_request: MakeRequest
) -> None:
    moto.fault("RunInstances", "InsufficientInstanceCapacity", times=1)
    offer = _offer(provider, "g5.xlarge", "us-east-1a")
    with pytest.raises(CapacityError) as refused:
        provider.launch_gang(offer, make_request("req-short", count=3))
    assert refused.value.scope == "zone" and refused.value.zone == "us-east-1a"
    assert _ours(moto, "req-short") == {"instances": [], "key_pairs": [], "security_groups": []}


def test_launch_takes_one_instance_only(provider: AwsProvider, make_request: MakeRequest) -> None:
    with pytest.raises(ProviderError, match="launch_gang"):
        provider.launch(_offer(provider, "g5.xlarge", "us-east-1a"), make_request(count=2))
