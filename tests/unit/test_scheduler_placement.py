"""Strategies, GPU choice and place()/explain() over snapshots and over an index."""

from __future__ import annotations

import pytest

from gpulayer.scheduler import (
    Placement,
    UnknownStrategy,
    Unplaced,
    WorkerIndex,
    explain,
    pick_gpus,
    place,
    rank,
)
from tests.unit.test_scheduler_builders import (
    A10G,
    A100_40,
    A100_80,
    H100,
    caps,
    cuda_caps,
    job,
    worker,
)

# --- strategies -----------------------------------------------------------------------------

LOADS = [
    # id, running, busy GPUs (of 4), busy cores (of 16), busy memory (of 128 GB)
    ("w1", 2, (), 0, 0),
    ("w2", 1, (0, 1), 2, 100),
    ("w3", 1, (0,), 8, 0),
    ("w4", 1, (0,), 2, 64),
    ("w0", 3, (), 0, 0),
    ("w5", 1, (0,), 2, 64),
]


def _fleet() -> list:
    return [
        worker(i, cuda_caps(A100_80, 4), busy_gpus=g, busy_cores=c, busy_memory=m, running=r)
        for i, r, g, c, m in LOADS
    ]


@pytest.mark.parametrize(
    ("strategy", "resources", "order"),
    [
        # fewest running, then most free GPUs, then most free cores, then id
        ("spread", {"accelerator": "cuda"}, ["w4", "w5", "w3", "w2", "w1", "w0"]),
        # a CPU job ranks by free cores, not idle GPUs
        ("spread", {}, ["w2", "w4", "w5", "w3", "w1", "w0"]),
        ("first_fit", {"accelerator": "cuda"}, ["w0", "w1", "w2", "w3", "w4", "w5"]),
        # free GPU memory: 4 free x 80 GB beats 3 free, then 2 free; ties by id
        ("most_free_memory", {"accelerator": "cuda"}, ["w0", "w1", "w3", "w4", "w5", "w2"]),
        # free host memory for a CPU job
        ("most_free_memory", {}, ["w0", "w1", "w3", "w4", "w5", "w2"]),
    ],
)
def test_strategy_order(strategy: str, resources: dict, order: list[str]) -> None:
    ranked = rank(job(strategy=strategy, **resources), _fleet())
    assert [w.id for w in ranked] == order


def test_most_free_host_memory_ranks_unreported_memory_last() -> None:
    fleet = [worker("a", caps(memory_gb=None)), worker("b", caps(memory_gb=8.0))]
    assert [w.id for w in rank(job(strategy="most_free_memory"), fleet)] == ["b", "a"]


def test_unknown_strategy_is_a_typed_error() -> None:
    with pytest.raises(UnknownStrategy, match="strategy: unknown 'random'"):
        rank(job(), _fleet(), strategy="random")


@pytest.mark.parametrize("use_index", [False, True])
def test_first_fit_packs_and_spread_spreads(use_index: bool) -> None:
    def run(strategy: str) -> list[str]:
        fleet = [worker(f"w{i}", cuda_caps(A100_80, 2)) for i in range(3)]
        index = WorkerIndex(fleet)
        placed = []
        for _ in range(4):
            spec = job(accelerator="cuda", strategy=strategy)
            result = place(spec, index if use_index else list(index))
            assert isinstance(result, Placement)
            index.assign(spec, result)
            placed.append(result.worker_id)
        return placed

    assert run("first_fit") == ["w0", "w0", "w1", "w1"]
    assert run("spread") == ["w0", "w1", "w2", "w0"]


# --- which GPUs -------------------------------------------------------------------------------


MIXED = caps(accelerator="cuda", gpus=(A10G, A100_80, A100_40, H100))


@pytest.mark.parametrize(
    ("resources", "busy", "expected"),
    [
        ({"gpu_count": 1}, (), (0,)),  # the smallest device when any will do
        ({"gpu_memory_gb": 40}, (), (2,)),  # the smallest that meets the memory
        ({"gpu_memory_gb": 40}, (2,), (1,)),
        ({"gpu_count": 2, "gpu_memory_gb": 60}, (), (1, 3)),
        ({"gpu_count": 2, "gpu_memory_gb": 60}, (1,), None),
        ({"min_cuda_compute_capability": "9.0"}, (), (3,)),
        ({"gpu_count": 3, "gpu_memory_gb": 30}, (), (1, 2, 3)),
    ],
)
def test_pick_gpus_meets_per_device_needs(
    resources: dict, busy: tuple[int, ...], expected: tuple[int, ...] | None
) -> None:
    spec = job(accelerator="cuda", **resources)
    w = worker("w1", MIXED, busy_gpus=busy)
    assert pick_gpus(spec.resources, w) == expected
    result = place(spec, [w])
    if expected is None:
        assert isinstance(result, Unplaced) and not result.never
    else:
        assert result == Placement("w1", expected)
        assert result == place(spec, WorkerIndex([w]))


def test_cpu_jobs_get_no_gpus() -> None:
    assert place(job(), [worker("w1", cuda_caps())]) == Placement("w1", ())


# --- place and explain ------------------------------------------------------------------------


@pytest.mark.parametrize("use_index", [False, True])
def test_unplaced_says_why_per_worker_and_whether_ever(use_index: bool) -> None:
    fleet = [
        worker("busy", cuda_caps(A100_80, 2), busy_gpus=(0, 1)),
        worker("small", cuda_caps(A10G, 2)),
        worker("cpu", caps()),
    ]
    workers = WorkerIndex(fleet) if use_index else fleet
    waiting = place(job(accelerator="cuda", gpu_memory_gb=40), workers)
    assert isinstance(waiting, Unplaced)
    assert waiting.never is False
    assert waiting.reasons == {
        "busy": ["needs 1 cuda GPU, 0 of 2 free"],
        "small": ["needs 1 cuda GPU with >= 40 GB, has 2 x NVIDIA A10G (24 GB)"],
        "cpu": ["needs a cuda accelerator, has cpu"],
    }
    impossible = place(job(accelerator="cuda", gpu_count=4), workers)
    assert isinstance(impossible, Unplaced) and impossible.never is True


def test_place_with_no_workers_is_never() -> None:
    result = place(job(), [])
    assert result == Unplaced(reasons={}, never=True)


def test_explain_lists_fitting_workers_and_common_reasons() -> None:
    fleet = [worker(f"w{i}", caps(cpu_cores=4)) for i in range(3)] + [worker("big", caps())]
    explanation = explain(job(cpu_cores=8), fleet)
    assert explanation.fits_now == ["big"]
    assert explanation.could_ever_run
    assert explanation.summary() == [("needs 8 CPU cores, has 4", 3)]
    assert explain(job(cpu_cores=8), WorkerIndex(fleet)) == explanation


def test_pinned_and_labelled_placement() -> None:
    fleet = [worker(f"w{i}", labels={"pool": "a" if i % 2 else "b"}) for i in range(6)]
    pinned = place(job(placement={"worker_ids": ["w4", "w5"]}, strategy="first_fit"), fleet)
    assert pinned == Placement("w4", ())
    labelled = place(job(placement={"worker_labels": {"pool": "a"}}, strategy="first_fit"), fleet)
    assert labelled == Placement("w1", ())
    nowhere = place(job(placement={"worker_labels": {"pool": "c"}}), fleet)
    assert isinstance(nowhere, Unplaced) and nowhere.never
