"""Filtering and ranking offers, the block list and the cheapest offer over a cap."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulayer.cloud.errors import AuthError, CapacityError, QuotaError
from gpulayer.cloud.offer import Offer, OfferQuery, parse_capability
from gpulayer.cloud.ranking import (
    BlockList,
    RankedOffers,
    cheapest_over_cap,
    describe_rejections,
    filter_offers,
    rank,
)


def offer(instance_type: str, price: float | None, **changes: Any) -> Offer:
    fields: dict[str, Any] = {
        "provider": "aws",
        "instance_type": instance_type,
        "region": "us-east-1",
        "zone": "us-east-1a",
        "accelerator": "cuda",
        "gpu_name": "A10G",
        "gpu_count": 1,
        "gpu_memory_gb": 24,
        "gpu_memory_kind": "dedicated",
        "cuda_compute_capability": "8.6",
        "cpu_cores": 4,
        "memory_gb": 16,
        "hourly_price": price,
    }
    fields.update(changes)
    return Offer.model_validate(fields)


def names(offers: list[Offer]) -> list[str]:
    return [o.instance_type for o in offers]


ONE_GPU = OfferQuery(accelerator="cuda", gpu_count_exact=False)
"""At least one GPU: these tests are about order, which counts GPUs too."""


def test_cheapest_first_unknown_price_last() -> None:
    offers = [offer("b", 2.0), offer("unknown", None), offer("a", 1.0), offer("c", 3.0)]
    result = filter_offers(offers, ONE_GPU)
    assert names(result.offers) == ["a", "b", "c", "unknown"]
    assert result.rejected == {}


def test_ties_prefer_fewer_gpus_then_names_then_on_demand() -> None:
    offers = [
        offer("eight", 5.0, gpu_count=8),
        offer("one-z2", 5.0, zone="us-east-1b"),
        offer("one-z1", 5.0, spot=True),
        offer("one-z1", 5.0),
        offer("one-other-region", 5.0, region="eu-west-1", zone="eu-west-1a"),
        offer("gcp", 5.0, provider="gcp"),
    ]
    ranked = filter_offers(offers, ONE_GPU).offers
    assert names(ranked) == ["one-other-region", "one-z1", "one-z1", "one-z2", "gcp", "eight"]
    assert [o.spot for o in ranked[1:3]] == [False, True]


def test_each_rejection_counted_once_under_first_reason() -> None:
    offers = [
        offer("fits", 1.0),
        offer("few-gpus", 1.0),  # fails gpu_count only
        offer("few-gpus-and-small", 1.0, gpu_memory_gb=8),  # gpu_count comes first
        offer("small-memory", 1.0, gpu_count=2, gpu_memory_gb=8),
        offer("old", 1.0, gpu_count=2, cuda_compute_capability="7.0"),
        offer("no-cc", 1.0, gpu_count=2, cuda_compute_capability=None),
        offer("arm", 1.0, gpu_count=2, cpu_arch="aarch64"),
        offer("cpu", 1.0, accelerator="cpu", gpu_count=0, gpu_name=None),
    ]
    offers[0] = offer("fits", 1.0, gpu_count=2)
    query = OfferQuery(
        accelerator="cuda",
        gpu_count=2,
        gpu_memory_gb=20,
        min_cuda_compute_capability="8.0",
        cpu_arch=("x86_64",),
    )
    result = filter_offers(offers, query)
    assert names(result.offers) == ["fits"]
    assert result.rejected == {
        "accelerator: not cuda": 1,
        "gpu_count: not exactly 2 GPUs": 2,
        "gpu_memory_gb: under 20 GB per GPU or unknown": 1,
        "min_cuda_compute_capability: below 8.0 or unknown": 2,
        "cpu_arch: not one of x86_64": 1,
    }
    assert sum(result.rejected.values()) == len(offers) - len(result.offers)
    assert describe_rejections(result.rejected).startswith("2 offers: gpu_count")


def test_cpu_query_accepts_gpu_offers_but_ranks_them_by_price() -> None:
    offers = [
        offer("gpu", 1.0),
        offer("cpu-small", 0.05, accelerator="cpu", gpu_count=0, cpu_cores=2),
        offer("cpu-big", 0.4, accelerator="cpu", gpu_count=0, cpu_cores=16),
    ]
    result = filter_offers(offers, OfferQuery(cpu_cores=4, memory_gb=8))
    assert names(result.offers) == ["cpu-big", "gpu"]
    assert result.rejected == {"cpu_cores: fewer than 4": 1}


def test_gpu_name_matches_after_normalizing() -> None:
    offers = [offer("a100", 3.0, gpu_name="NVIDIA A100"), offer("a10g", 1.0)]
    result = filter_offers(offers, OfferQuery(accelerator="cuda", gpu_name="a100"))
    assert names(result.offers) == ["a100"]
    assert result.rejected == {"gpu_models: not A100": 1}


def test_disk_chosen_at_launch_always_fits() -> None:
    offers = [offer("ebs", 1.0, disk_gb=None), offer("small-local", 0.5, disk_gb=50)]
    result = filter_offers(offers, OfferQuery(accelerator="cuda", disk_gb=100))
    assert names(result.offers) == ["ebs"]


def test_memory_kind_os_and_spot_filters() -> None:
    offers = [
        offer("unified", 1.0, gpu_memory_kind="unified"),
        offer("windows", 1.0, os="windows"),
        offer("spot", 0.3, spot=True),
        offer("on-demand", 1.0),
    ]
    query = OfferQuery(accelerator="cuda", gpu_memory_kind="dedicated", os=("linux",), spot=False)
    result = filter_offers(offers, query)
    assert names(result.offers) == ["on-demand"]
    assert result.rejected == {
        "gpu_memory_kind: not dedicated": 1,
        "os: not one of linux": 1,
        "spot: on-demand offers only": 1,
    }
    only_spot = filter_offers(offers, OfferQuery(accelerator="cuda", spot=True))
    assert names(only_spot.offers) == ["spot"]


def test_cap_rejects_unpriced_and_expensive_offers() -> None:
    offers = [offer("cheap", 1.0), offer("dear", 9.0), offer("unknown", None)]
    result = filter_offers(offers, ONE_GPU, max_hourly_cost=5)
    assert names(result.offers) == ["cheap"]
    assert result.rejected == {
        "max_hourly_cost: no known price": 1,
        "max_hourly_cost: above 5 USD/h": 1,
    }
    at_cap = filter_offers([offer("exact", 5.0)], ONE_GPU, max_hourly_cost=5)
    assert names(at_cap.offers) == ["exact"]


def test_other_currency_rejected_without_conversion() -> None:
    offers = [offer("usd", 2.0), offer("eur", 1.0, currency="EUR"), offer("eur-unpriced", None)]
    result = filter_offers(offers, ONE_GPU)
    assert names(result.offers) == ["usd", "eur-unpriced"]
    assert result.rejected == {"currency: priced in another currency than USD": 1}
    in_euros = filter_offers(offers, ONE_GPU, currency="EUR", max_hourly_cost=10)
    assert names(in_euros.offers) == ["eur"]


def test_providers_and_regions_restrict_where() -> None:
    offers = [
        offer("aws-east", 1.0),
        offer("aws-west", 1.0, region="us-west-2", zone="us-west-2a"),
        offer("gcp-east", 1.0, provider="gcp"),
    ]
    result = filter_offers(offers, ONE_GPU, providers=["aws"], regions=["us-east-1"])
    assert names(result.offers) == ["aws-east"]
    assert result.rejected == {
        "providers: not in placement.providers": 1,
        "regions: not in placement.regions": 1,
    }


def test_block_list_scopes() -> None:
    offers = [
        offer("zone-a", 1.0),
        offer("zone-b", 2.0, zone="us-east-1b"),
        offer("west", 3.0, region="us-west-2", zone="us-west-2a"),
        offer("gcp", 4.0, provider="gcp", region="us-central1", zone="us-central1-a"),
    ]
    blocked = BlockList()
    blocked.record(CapacityError("zone", "aws", "us-east-1", "us-east-1a", "no g5 left"))
    result = filter_offers(offers, ONE_GPU, blocked=blocked)
    assert names(result.offers) == ["zone-b", "west", "gcp"]
    assert result.rejected == {"blocked: capacity in zone us-east-1a": 1}

    blocked.record(QuotaError("aws", "us-east-1", "vCPU limit"))
    assert names(filter_offers(offers, ONE_GPU, blocked=blocked).offers) == ["west", "gcp"]

    blocked.record(AuthError("aws", "bad key"))
    result = filter_offers(offers, ONE_GPU, blocked=blocked)
    assert names(result.offers) == ["gcp"]
    assert result.rejected == {"blocked: auth at provider aws": 3}
    assert len(blocked) == 3


def test_capacity_error_without_zone_blocks_its_region() -> None:
    error = CapacityError("zone", "aws", "us-east-1", None, "no capacity")
    assert error.scope == "region"
    blocked = BlockList()
    blocked.record(error)
    assert blocked.reason_for(offer("x", 1.0, zone="us-east-1c")) == (
        "blocked: capacity in region us-east-1"
    )
    assert blocked.reason_for(offer("y", 1.0, region="us-west-2", zone="us-west-2a")) is None


def test_cheapest_over_cap_names_what_the_job_would_cost() -> None:
    offers = [offer("b", 7.0), offer("a", 6.0), offer("small", 0.5, gpu_count=1)]
    query = OfferQuery(accelerator="cuda", gpu_count=1, gpu_memory_gb=20)
    assert cheapest_over_cap(offers, query, max_hourly_cost=0.1).instance_type == "small"
    assert cheapest_over_cap(offers, query, max_hourly_cost=1).instance_type == "a"
    assert cheapest_over_cap(offers, query, max_hourly_cost=100) is None
    eight = OfferQuery(accelerator="cuda", gpu_count=8)
    assert cheapest_over_cap(offers, eight, max_hourly_cost=1) is None


def test_a_slice_of_a_gpu_fits_only_a_job_that_accepts_slices() -> None:
    offers = [
        offer("g6f.large", 0.2, gpu_name="L4", gpu_memory_gb=2.79, gpu_slice=0.125),
        offer("g6.xlarge", 0.8, gpu_name="L4", gpu_memory_gb=22.35),
    ]
    whole = OfferQuery(accelerator="cuda", gpu_count=1)
    result = filter_offers(offers, whole)
    assert names(result.offers) == ["g6.xlarge"]
    assert result.rejected == {
        "gpu_slices: a slice of one GPU (resources.gpu_slices accepts it)": 1
    }
    sliced = whole.model_copy(update={"gpu_slices": True})
    assert names(filter_offers(offers, sliced).offers) == ["g6f.large", "g6.xlarge"]
    # The slice's memory is its own: 4 GB per GPU rules the eighth of an L4 out.
    roomy = sliced.model_copy(update={"gpu_memory_gb": 4})
    assert names(filter_offers(offers, roomy).offers) == ["g6.xlarge"]
    # A CPU job may run on any machine; a slice is no reason to turn one down.
    assert len(filter_offers(offers, OfferQuery()).offers) == 2
    with pytest.raises(ValueError, match="gpu_slice"):
        offer("c6i.large", 0.1, accelerator="cpu", gpu_count=0, gpu_name=None, gpu_slice=0.5)


def test_ranked_offers_filter_again_and_again() -> None:
    offers = [offer(f"t{i}", float(10 - i), gpu_count=1 + i % 3) for i in range(10)]
    ranked = rank(offers)
    assert isinstance(ranked, RankedOffers)
    assert rank(ranked) is ranked
    assert names(list(ranked)) == [f"t{i}" for i in range(9, -1, -1)]
    assert ranked[0].instance_type == "t9" and len(ranked) == 10
    two = OfferQuery(accelerator="cuda", gpu_count=2)
    first = filter_offers(ranked, two, max_hourly_cost=8)
    again = filter_offers(ranked, two, max_hourly_cost=8)
    assert first == again == filter_offers(offers, two, max_hourly_cost=8)
    assert all(o.gpu_count >= 2 and (o.hourly_price or 99) <= 8 for o in first.offers)


# --- property: the filter agrees with a plain per-offer reading of the rules ----------------


def _fits(o: Offer, q: OfferQuery, cap: float | None, currency: str) -> bool:
    if q.accelerator != "cpu" and o.accelerator != q.accelerator:
        return False
    if o.gpu_count < q.gpu_count or o.cpu_cores < q.cpu_cores:
        return False
    if q.gpu_count and q.gpu_count_exact and o.gpu_count != q.gpu_count:
        return False
    if q.gpu_count and not q.gpu_slices and o.gpu_slice is not None:
        return False
    if q.gpu_memory_gb is not None and (o.gpu_memory_gb or 0) < q.gpu_memory_gb:
        return False
    if q.min_cuda_compute_capability is not None:
        cc = o.cuda_compute_capability
        if cc is None or parse_capability(cc) < parse_capability(q.min_cuda_compute_capability):
            return False
    if q.memory_gb is not None and (o.memory_gb or 0) < q.memory_gb:
        return False
    if q.cpu_arch and o.cpu_arch not in q.cpu_arch:
        return False
    if q.spot is not None and o.spot != q.spot:
        return False
    if o.hourly_price is not None and o.currency != currency:
        return False
    return cap is None or (o.hourly_price is not None and o.hourly_price <= cap)


_offers = st.builds(
    lambda i, gpus, price, cc, mem, arch, spot, cur, part: offer(
        f"t{i}",
        price,
        accelerator="cuda" if gpus else "cpu",
        gpu_count=gpus,
        gpu_name="X" if gpus else None,
        gpu_memory_gb=mem if gpus else None,
        cuda_compute_capability=cc if gpus else None,
        cpu_arch=arch,
        spot=spot,
        currency=cur,
        zone=f"us-east-1{'abc'[i % 3]}",
        gpu_slice=part if gpus else None,
    ),
    st.integers(0, 10_000),
    st.sampled_from([0, 1, 2, 4, 8]),
    st.one_of(st.none(), st.floats(0, 50, allow_nan=False)),
    st.sampled_from([None, "7.0", "8.0", "8.6", "9.0"]),
    st.floats(1, 100),
    st.sampled_from(["x86_64", "aarch64"]),
    st.booleans(),
    st.sampled_from(["USD", "USD", "EUR"]),
    st.sampled_from([None, None, 0.125, 0.5]),
)
_queries = st.builds(
    lambda gpus, mem, cc, arch, spot, exact, slices: OfferQuery(
        accelerator="cuda" if gpus else "cpu",
        gpu_count=gpus,
        gpu_count_exact=exact,
        gpu_memory_gb=mem if gpus else None,
        min_cuda_compute_capability=cc if gpus else None,
        cpu_arch=arch,
        spot=spot,
        gpu_slices=slices,
    ),
    st.sampled_from([0, 1, 2, 8]),
    st.one_of(st.none(), st.floats(1, 100)),
    st.sampled_from([None, "8.0", "9.0"]),
    st.sampled_from([(), ("x86_64",)]),
    st.sampled_from([None, True, False]),
    st.booleans(),
    st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(_offers, max_size=40),
    _queries,
    st.one_of(st.none(), st.floats(0, 50)),
    st.sampled_from(["USD", "EUR"]),
)
def test_filter_matches_plain_reading(
    offers: list[Offer], query: OfferQuery, cap: float | None, currency: str
) -> None:
    result = filter_offers(offers, query, max_hourly_cost=cap, currency=currency)
    expected = [o for o in offers if _fits(o, query, cap, currency)]
    assert sorted(map(id, result.offers)) == sorted(map(id, expected))
    keys = [o.rank_key for o in result.offers]
    assert keys == sorted(keys)
    assert sum(result.rejected.values()) == len(offers) - len(result.offers)
    if cap is not None:
        assert all(o.hourly_price is not None and o.hourly_price <= cap for o in result.offers)


@pytest.mark.parametrize("scope", ["zone", "region", "provider"])
def test_capacity_error_message_names_scope(scope: str) -> None:
    error = CapacityError(scope, "aws", "us-east-1", "us-east-1a", "InsufficientInstanceCapacity")  # type: ignore[arg-type]
    assert str(error).startswith("aws: InsufficientInstanceCapacity")
    assert error.scope == scope
