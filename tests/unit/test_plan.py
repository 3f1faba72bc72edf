"""Explaining where a job would run (`gpulayer plan`): the offer filter's reasons per offer,
the cloud plan's costs, and the worker plan behind submit's target decision. Pure."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulayer.cloud.offer import OfferQuery
from gpulayer.cloud.offer_plan import describe_cost, plan_offers, worst_case_cost
from gpulayer.cloud.ranking import filter_offers, filter_offers_explained, rank
from gpulayer.control.plan import plan_job, worker_plan
from gpulayer.control.targets import choose_target
from gpulayer.spec import JobSpec
from gpulayer.spec.models import PlacementPolicy
from tests.unit.test_offers_ranking import offer
from tests.unit.test_targets import CPU_BOX, GPU_BOX, spec, view

EIGHT_A100 = OfferQuery(accelerator="cuda", gpu_count=8, gpu_models=("A100",))


def catalog() -> list[Any]:
    return [
        offer("g5.xlarge", 1.006),
        offer("g5.48xlarge", 16.288, gpu_count=8),
        offer("p4d.24xlarge", 21.957642, gpu_name="A100", gpu_count=8, gpu_memory_gb=40),
        offer("p4de.24xlarge", 27.44705, gpu_name="A100", gpu_count=8, gpu_memory_gb=80),
    ]


def test_each_turned_down_offer_carries_the_first_reason_it_failed() -> None:
    explained = filter_offers_explained(catalog(), EIGHT_A100)
    assert [o.instance_type for o in explained.result.offers] == ["p4d.24xlarge", "p4de.24xlarge"]
    assert [(o.instance_type, why) for o, why in explained.turned_down] == [
        ("g5.xlarge", "gpu_count: not exactly 8 GPUs"),
        ("g5.48xlarge", "gpu_models: not A100"),
    ]


@settings(max_examples=50, deadline=None)
@given(
    prices=st.lists(st.one_of(st.none(), st.floats(0.01, 100)), min_size=1, max_size=12),
    cap=st.one_of(st.none(), st.floats(0.01, 100)),
    count=st.integers(1, 8),
)
def test_the_explained_filter_decides_as_the_plain_one(
    prices: list[float | None], cap: float | None, count: int
) -> None:
    offers = [
        offer(f"t{i}", price, gpu_count=1 + i % 8, spot=i % 3 == 0)
        for i, price in enumerate(prices)
    ]
    query = OfferQuery(accelerator="cuda", gpu_count=count)
    plain = filter_offers(offers, query, max_hourly_cost=cap)
    explained = filter_offers_explained(offers, query, max_hourly_cost=cap)
    assert explained.result == plain
    assert len(explained.turned_down) == sum(plain.rejected.values())
    for _, why in explained.turned_down:
        assert why in plain.rejected


def test_a_cloud_plan_names_the_cheapest_fit_its_worst_case_and_what_cheaper_failed() -> None:
    placement = PlacementPolicy(target="cloud")
    planned = plan_offers(rank(catalog()), EIGHT_A100, placement, timeout_seconds=7200)
    first = planned["offers"][0]
    assert first["instance_type"] == "p4d.24xlarge"
    assert first["worst_case_cost"] == pytest.approx(21.957642 * 2)
    assert describe_cost(first) == "21.957642 USD/h, worst case 43.92 USD"
    assert planned["fitting_total"] == 2
    assert [(r["instance_type"], r["reason"]) for r in planned["cheaper_rejected"]] == [
        ("g5.xlarge", "gpu_count: not exactly 8 GPUs"),
        ("g5.48xlarge", "gpu_models: not A100"),
    ]
    # The dearer A100 offer fits: it is listed, not among the offers turned down.
    assert planned["cheaper_rejected_total"] == 2


def test_no_timeout_means_an_unbounded_worst_case_and_a_gang_pays_per_node() -> None:
    p4d = catalog()[2]
    assert worst_case_cost(p4d, None, 1) is None
    assert worst_case_cost(p4d, 3600, 4) == pytest.approx(4 * 21.957642)
    planned = plan_offers(
        rank(catalog()), EIGHT_A100, PlacementPolicy(target="cloud"), timeout_seconds=None
    )
    assert describe_cost(planned["offers"][0]).endswith("worst case unbounded (no timeout_seconds)")


def test_under_a_cap_every_offer_turned_down_is_listed_cheapest_first() -> None:
    placement = PlacementPolicy(target="cloud", max_hourly_cost=1)
    planned = plan_offers(rank(catalog()), EIGHT_A100, placement, timeout_seconds=60)
    assert planned["offers"] == []
    assert [r["reason"] for r in planned["cheaper_rejected"]] == [
        "gpu_count: not exactly 8 GPUs",
        "gpu_models: not A100",
        "max_hourly_cost: above 1 USD/h",
        "max_hourly_cost: above 1 USD/h",
    ]


def test_workers_that_fit_are_ranked_and_the_others_counted_per_reason() -> None:
    job = spec(target="remote", resources={"accelerator": "cuda", "gpu_count": 1})
    workers = [view("remote", CPU_BOX, "cpu1"), view("remote", CPU_BOX, "cpu2")]
    workers.append(view("remote", GPU_BOX, "gpu1"))
    planned = worker_plan(job, [w.snapshot for w in workers])
    assert [(w["rank"], w["worker_id"], w["fits_now"]) for w in planned["workers"]] == [
        (1, "gpu1", True)
    ]
    assert planned["registered"] == 3
    assert planned["rejected"] == {"needs a cuda accelerator, has cpu": 2}


def test_a_plan_walks_the_chain_to_the_target_submit_chooses() -> None:
    job: JobSpec = spec(fallback_targets=["remote"], resources={"accelerator": "cuda"})
    workers = [view("local", CPU_BOX, "here"), view("remote", GPU_BOX, "gpu1")]
    planned = plan_job(job, workers, choose_target(job, workers), cloud=None)
    assert planned["target"] == "remote"
    local, remote = planned["tried"]
    assert (local["target"], local["role"], local["outcome"]) == ("local", "target", "skipped")
    assert "needs a cuda accelerator" in local["why"]
    assert local["rejected"] == {"needs a cuda accelerator, has cpu": 1}
    assert (remote["role"], remote["outcome"]) == ("fallback", "chosen")
    assert [w["worker_id"] for w in remote["workers"]] == ["gpu1"]


def test_a_plan_of_a_job_nothing_can_run_says_so_for_each_target() -> None:
    job: JobSpec = spec(fallback_targets=["cloud"], resources={"accelerator": "cuda"})
    workers = [view("local", CPU_BOX, "here")]
    planned = plan_job(job, workers, choose_target(job, workers), cloud=None)
    assert planned["target"] is None
    assert [step["outcome"] for step in planned["tried"]] == ["skipped", "unschedulable"]
    assert planned["tried"][1]["why"] == "no cloud provider is installed or enabled"
    assert planned["tried"][1]["cloud"] is None


def test_a_remote_job_with_no_worker_yet_waits_and_the_plan_says_for_what() -> None:
    job: JobSpec = spec(target="remote", resources={"accelerator": "cuda", "gpu_count": 1})
    workers = [view("remote", CPU_BOX, "cpu1")]
    planned = plan_job(job, workers, choose_target(job, workers), cloud=None)
    [step] = planned["tried"]
    assert (planned["target"], step["outcome"]) == ("remote", "waits")
    assert "needs a cuda accelerator" in step["why"]
    assert planned["headline"].startswith("plan: the job would wait on remote: ")
    assert step["workers"] == [] and step["rejected"] == {"needs a cuda accelerator, has cpu": 1}


def test_the_headline_names_the_worker_or_the_first_offer() -> None:
    job: JobSpec = spec(target="remote")
    workers = [view("remote", GPU_BOX, "gpu1")]
    planned = plan_job(job, workers, choose_target(job, workers), cloud=None)
    assert planned["headline"] == "plan: the job would run on remote worker gpu1 (gpu1)"
    cloud_job: JobSpec = spec(target="cloud")
    offers = plan_offers(
        rank(catalog()), OfferQuery(accelerator="cpu"), cloud_job.placement, timeout_seconds=None
    )
    decision = choose_target(cloud_job, [], cloud_available=True)
    planned = plan_job(cloud_job, [], decision, cloud=lambda _: offers)
    assert planned["headline"] == (
        f"plan: the job would run on cloud, first trying {offers['offers'][0]['label']}"
    )
