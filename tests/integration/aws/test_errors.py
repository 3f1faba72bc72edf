"""EC2 failures become typed errors with the right scope; a failed launch leaves nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from gpulayer_aws import AwsProvider

from gpulayer.cloud.errors import (
    AuthError,
    CapacityError,
    ProviderError,
    QuotaError,
    ScopedProviderError,
)
from gpulayer.cloud.offer import OfferQuery
from gpulayer.cloud.protocol import LaunchRequest
from gpulayer.cloud.ranking import BlockList, filter_offers

from .conftest import Moto

MakeRequest = Callable[..., LaunchRequest]
G5 = OfferQuery(accelerator="cuda", gpu_name="A10G", gpu_count=1, cpu_cores=4)


def _nothing_left(moto: Moto) -> None:
    ec2 = moto.ec2()
    tag = [{"Name": "tag-key", "Values": ["gpulayer:request"]}]
    assert ec2.describe_key_pairs(Filters=tag)["KeyPairs"] == []
    assert ec2.describe_security_groups(Filters=tag)["SecurityGroups"] == []


def test_capacity_in_first_zone_moves_on_to_the_next(
    moto: Moto, provider: AwsProvider, make_request: MakeRequest
) -> None:
    moto.fault(
        "RunInstances",
        "InsufficientInstanceCapacity",
        message="We currently do not have sufficient g5.xlarge capacity in us-east-1a.",
        match={"Placement.AvailabilityZone": "us-east-1a"},
    )
    offers = provider.offers(G5)
    blocked = BlockList()
    tried: list[str] = []
    launched = None
    for attempt in range(5):
        ranked = filter_offers(offers, G5, blocked=blocked).offers
        offer = ranked[0]
        tried.append(offer.label)
        try:
            launched = provider.launch(offer, make_request(f"req-cap-{attempt}"))
            break
        except CapacityError as exc:
            assert (exc.scope, exc.provider, exc.region, exc.zone) == (
                "zone",
                "aws",
                "us-east-1",
                "us-east-1a",
            )
            assert "InsufficientInstanceCapacity" in str(exc)
            blocked.record(exc)
            _nothing_left(moto)
    assert tried == ["aws/us-east-1a/g5.xlarge", "aws/us-east-1b/g5.xlarge"]
    assert launched is not None and launched.zone == "us-east-1b"
    provider.terminate([launched.id])
    _nothing_left(moto)


def test_quota_error_is_scoped_to_the_region(
    moto: Moto, provider: AwsProvider, make_request: MakeRequest
) -> None:
    moto.fault("RunInstances", "VcpuLimitExceeded", message="You have requested more vCPU.")
    offer = filter_offers(provider.offers(G5), G5).offers[0]
    with pytest.raises(QuotaError) as info:
        provider.launch(offer, make_request("req-quota"))
    assert (info.value.scope, info.value.region, info.value.zone) == ("region", "us-east-1", None)
    _nothing_left(moto)
    blocked = BlockList()
    blocked.record(info.value)
    assert filter_offers(provider.offers(G5), G5, blocked=blocked).offers == []


@pytest.mark.parametrize("code", ["MaxSpotInstanceCountExceeded", "InstanceLimitExceeded"])
def test_other_quota_codes(
    moto: Moto, provider: AwsProvider, make_request: MakeRequest, code: str
) -> None:
    moto.fault("RunInstances", code)
    offer = filter_offers(provider.offers(G5), G5).offers[0]
    with pytest.raises(QuotaError, match=code):
        provider.launch(offer, make_request("req-q2"))


def test_unsupported_is_a_zone_capacity_error(
    moto: Moto, provider: AwsProvider, make_request: MakeRequest
) -> None:
    moto.fault("RunInstances", "Unsupported", message="not supported in your requested zone")
    offer = filter_offers(provider.offers(G5), G5).offers[0]
    with pytest.raises(CapacityError) as info:
        provider.launch(offer, make_request("req-unsup"))
    assert (info.value.scope, info.value.zone) == ("zone", offer.zone)


@pytest.mark.parametrize("code", ["AuthFailure", "UnauthorizedOperation"])
def test_auth_failure_blocks_the_provider(
    moto: Moto, settings: dict[str, Any], make_request: MakeRequest, code: str, tmp_path: Any
) -> None:
    moto.fault("*", code, message="AWS was not able to validate the provided credentials")
    provider = AwsProvider({**settings, "cache_dir": str(tmp_path / "cache")})
    with pytest.raises(AuthError) as info:
        provider.offers(G5)
    assert (info.value.scope, info.value.provider) == ("provider", "aws")
    assert code in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(AuthError):
        provider.list_owned({"gpulayer:owner": "x"})


def test_launch_auth_failure(moto: Moto, provider: AwsProvider, make_request: MakeRequest) -> None:
    offer = filter_offers(provider.offers(G5), G5).offers[0]
    moto.fault("*", "AuthFailure")
    with pytest.raises(AuthError):
        provider.launch(offer, make_request("req-auth"))


def test_missing_credentials_is_one_clear_auth_error(
    moto: Moto,
    settings: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    provider = AwsProvider({**settings, "cache_dir": str(tmp_path / "cache")})
    with pytest.raises(AuthError) as info:
        provider.offers(G5)
    message = str(info.value)
    assert message.startswith("aws: no AWS credentials found")
    assert "\n" not in message
    assert moto.calls() == []


def test_unknown_profile_is_an_auth_error(
    moto: Moto, settings: dict[str, Any], tmp_path: Any
) -> None:
    provider = AwsProvider(
        {**settings, "profile": "no-such-profile", "cache_dir": str(tmp_path / "cache")}
    )
    with pytest.raises(AuthError, match="no-such-profile"):
        provider.offers(G5)


def test_other_codes_are_unscoped_provider_errors(
    moto: Moto, provider: AwsProvider, make_request: MakeRequest
) -> None:
    moto.fault("RunInstances", "InvalidParameterCombination", message="bad combination")
    offer = filter_offers(provider.offers(G5), G5).offers[0]
    with pytest.raises(ProviderError) as info:
        provider.launch(offer, make_request("req-other"))
    assert not isinstance(info.value, ScopedProviderError)
    assert str(info.value) == "aws: InvalidParameterCombination: bad combination"
    _nothing_left(moto)
