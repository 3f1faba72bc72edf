"""plan(): FIFO with backfill, no double booking, and the anti-starvation reservation."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from gpulayer.scheduler import (
    Assignment,
    Placement,
    QueuedJob,
    Reservation,
    WorkerIndex,
    WorkerSnapshot,
    plan,
    plan_pass,
    reasons_now,
)
from gpulayer.spec import JobSpec
from tests.unit.test_scheduler_builders import (
    A100_80,
    caps,
    cuda_caps,
    job,
    random_fleet,
    random_job,
    worker,
)

ONE_GPU = job(accelerator="cuda")
FOUR_GPUS = job(accelerator="cuda", gpu_count=4)


def test_fifo_among_jobs_that_fit() -> None:
    fleet = [worker("w1", cuda_caps(A100_80, 2))]
    queue = [
        QueuedJob("late", ONE_GPU, 3.0),
        QueuedJob("first", ONE_GPU, 1.0),
        QueuedJob("second", ONE_GPU, 2.0),
    ]
    assignments = plan(queue, fleet, now=10.0)
    assert [a.job_id for a in assignments] == ["first", "second"]
    assert sorted(a.gpu_indices for a in assignments) == [(0,), (1,)]


def test_equal_enqueue_times_break_ties_by_job_id() -> None:
    fleet = [worker("w1", cuda_caps(A100_80, 1))]
    queue = [QueuedJob("b", ONE_GPU, 1.0), QueuedJob("a", ONE_GPU, 1.0)]
    assert [a.job_id for a in plan(queue, fleet, now=1.0)] == ["a"]


def test_a_queue_in_admission_order_is_placed_in_that_order() -> None:
    fleet = [worker("w1", cuda_caps(A100_80, 1))]
    queue = [QueuedJob("urgent-but-late", ONE_GPU, 9.0), QueuedJob("early", ONE_GPU, 1.0)]
    assert [a.job_id for a in plan(queue, fleet, now=10.0)] == ["early"]
    given = plan_pass(queue, fleet, now=10.0, in_given_order=True)
    assert [a.job_id for a in given.assignments] == ["urgent-but-late"]


def test_a_big_job_that_does_not_fit_does_not_block_smaller_ones() -> None:
    fleet = [worker("w1", cuda_caps(A100_80, 4), busy_gpus=(0,))]
    queue = [QueuedJob("big", FOUR_GPUS, 0.0), QueuedJob("small", ONE_GPU, 1.0)]
    result = plan_pass(queue, fleet, now=10.0, starvation_seconds=300)
    assert result.assignments == [Assignment("small", "w1", (1,))]
    assert result.reservation is None


def test_cores_are_never_over_committed() -> None:
    fleet = [worker("w1", caps(cpu_cores=8)), worker("w2", caps(cpu_cores=8))]
    queue = [QueuedJob(f"j{i}", job(cpu_cores=3), float(i)) for i in range(8)]
    assignments = plan(queue, fleet, now=100.0)
    per_worker = {w: sum(1 for a in assignments if a.worker_id == w) for w in ("w1", "w2")}
    assert per_worker == {"w1": 2, "w2": 2}


def test_plan_updates_an_index_it_is_given() -> None:
    index = WorkerIndex([worker("w1", cuda_caps(A100_80, 2))])
    plan([QueuedJob("j1", ONE_GPU, 0.0)], index, now=0.0)
    assert index.get("w1").free_gpus == (1,)
    assert [a.gpu_indices for a in plan([QueuedJob("j2", ONE_GPU, 0.0)], index, now=0.0)] == [(1,)]


def _replay(queue: list[QueuedJob], fleet, assignments: list[Assignment]) -> dict[str, object]:
    """Apply the assignments in order, checking each fits at its turn; the final snapshots."""
    specs = {q.job_id: q.spec for q in queue}
    current = {w.id: w for w in fleet}
    for a in assignments:
        spec = specs[a.job_id]
        w = current[a.worker_id]
        assert reasons_now(spec, w) == [], (a, reasons_now(spec, w))
        assert set(a.gpu_indices) <= set(w.free_gpus)
        assert len(a.gpu_indices) == spec.resources.gpus
        current[a.worker_id] = w.take(
            a.gpu_indices, spec.resources.cpu_cores, spec.resources.memory_gb
        )
    return current


@pytest.mark.parametrize("seed", range(5))
def test_random_passes_never_double_book_and_leave_nothing_that_fits(seed: int) -> None:
    rng = random.Random(seed)
    fleet = random_fleet(rng, 120, kinds=15)
    ids = [w.id for w in fleet]
    queue = [QueuedJob(f"j{i:04d}", random_job(rng, ids), rng.uniform(0, 1000)) for i in range(400)]
    assignments = plan(queue, fleet, now=1000.0, starvation_seconds=math.inf)
    assert len({a.job_id for a in assignments}) == len(assignments)
    final = _replay(queue, fleet, assignments)
    # As many as fit: every job left waiting fits nowhere once the pass is done.
    placed = {a.job_id for a in assignments}
    for q in queue:
        if q.job_id not in placed:
            assert all(reasons_now(q.spec, w) for w in final.values()), q.job_id
    # FIFO: among jobs with the same request, the older ones were placed first.
    by_request: dict[str, list[QueuedJob]] = {}
    for q in queue:
        by_request.setdefault(
            q.spec.model_dump_json(exclude={"placement": {"strategy"}}), []
        ).append(q)
    for same in by_request.values():
        same.sort(key=lambda q: q.enqueued_at)
        flags = [q.job_id in placed for q in same]
        assert flags == sorted(flags, reverse=True)
    assert len(assignments) > 20


def test_a_starving_job_reserves_the_closest_worker_and_others_backfill_elsewhere() -> None:
    fleet = [
        worker("w1", cuda_caps(A100_80, 4), busy_gpus=(0, 1, 2), running=3),
        worker("w2", cuda_caps(A100_80, 4), busy_gpus=(0,), running=1),
        worker("w3", cuda_caps(A100_80, 4), busy_gpus=(0, 1), running=2),
    ]
    queue = [QueuedJob("big", FOUR_GPUS, 0.0)] + [
        QueuedJob(f"s{i}", ONE_GPU, 1.0 + i) for i in range(4)
    ]
    early = plan_pass(queue, fleet, now=100.0, starvation_seconds=300)
    assert early.reservation is None
    assert {a.worker_id for a in early.assignments} >= {"w2"}
    late = plan_pass(queue, fleet, now=400.0, starvation_seconds=300)
    assert late.reservation == Reservation("big", "w2")
    assert all(a.worker_id != "w2" for a in late.assignments)
    assert sorted(a.job_id for a in late.assignments) == ["s0", "s1", "s2"]


def test_older_jobs_keep_their_turn_over_a_reservation() -> None:
    fleet = [worker("w1", cuda_caps(A100_80, 4), busy_gpus=(0,), running=1)]
    queue = [
        QueuedJob("older", ONE_GPU, 0.0),
        QueuedJob("big", FOUR_GPUS, 1.0),
        QueuedJob("younger", ONE_GPU, 2.0),
    ]
    result = plan_pass(queue, fleet, now=1000.0, starvation_seconds=300)
    assert [a.job_id for a in result.assignments] == ["older"]
    assert result.reservation == Reservation("big", "w1")


def test_a_job_no_ready_worker_could_run_does_not_take_the_reservation() -> None:
    fleet = [
        worker("w1", cuda_caps(A100_80, 2), busy_gpus=(0,)),
        worker("w8", cuda_caps(A100_80, 8), state="draining"),
    ]
    queue = [
        QueuedJob("huge", job(accelerator="cuda", gpu_count=8), 0.0),
        QueuedJob("pair", job(accelerator="cuda", gpu_count=2), 1.0),
        QueuedJob("one", ONE_GPU, 2.0),
    ]
    result = plan_pass(queue, fleet, now=1000.0, starvation_seconds=300)
    assert result.reservation == Reservation("pair", "w1")
    assert result.assignments == []


# --- a simulation: small jobs keep arriving while a big one waits ------------------------------


@dataclass
class _Running:
    job_id: str
    spec: JobSpec
    placement: Placement
    ends_at: float


def _simulate(starvation_seconds: float, ticks: int = 60) -> tuple[float | None, int]:
    """Two 4-GPU workers; two 1-GPU jobs of 30 s arrive every 10 s; one 4-GPU job waits.

    Returns when the big job started (None if never) and how many small jobs ran.
    """
    index = WorkerIndex([worker(f"w{i}", cuda_caps(A100_80, 4)) for i in range(2)])
    queue = [QueuedJob("big", FOUR_GPUS, 0.0)]
    queue += [QueuedJob(f"warm{i}", ONE_GPU, -1.0) for i in range(2)]
    running: list[_Running] = []
    big_started = None
    small_started = 0
    for tick in range(ticks):
        now = tick * 10.0
        for r in [r for r in running if r.ends_at <= now]:
            index.release(r.spec, r.placement)
            running.remove(r)
        queue += [QueuedJob(f"s{tick}-{k}", ONE_GPU, now) for k in range(2)]
        result = plan_pass(queue, index, now=now, starvation_seconds=starvation_seconds)
        started = {a.job_id for a in result.assignments}
        if result.reservation is not None:
            reserved = result.reservation.worker_id
            assert all(
                a.worker_id != reserved or a.job_id == result.reservation.job_id
                for a in result.assignments
            )
        specs = {q.job_id: q.spec for q in queue}
        for a in result.assignments:
            duration = 50.0 if a.job_id == "big" else 30.0
            running.append(
                _Running(
                    a.job_id, specs[a.job_id], Placement(a.worker_id, a.gpu_indices), now + duration
                )
            )
            if a.job_id == "big":
                big_started = now
            else:
                small_started += 1
        queue = [q for q in queue if q.job_id not in started]
        # No GPU is held by two running jobs, and the index agrees with what runs.
        for w in index:
            held = [
                g for r in running if r.placement.worker_id == w.id for g in r.placement.gpu_indices
            ]
            assert len(held) == len(set(held))
            assert sorted(held + list(w.free_gpus)) == [0, 1, 2, 3]
    return big_started, small_started


def test_without_the_rule_a_stream_of_small_jobs_starves_the_big_one() -> None:
    started, smalls = _simulate(starvation_seconds=math.inf)
    assert started is None
    assert smalls > 100


def test_the_rule_lets_the_big_job_run_while_small_jobs_keep_flowing() -> None:
    started, smalls = _simulate(starvation_seconds=60.0)
    assert started is not None
    # Reserved at 60 s; the reserved worker's 1-GPU jobs last 30 s, so it drains by 100 s.
    assert 60.0 <= started <= 100.0
    assert smalls > 80


# --- a pass stops once no worker has a core left -------------------------------------------


def _counted(queue: list[QueuedJob], taken: list[int]) -> Iterator[QueuedJob]:
    for item in queue:
        taken[0] += 1
        yield item


def test_a_pass_stops_once_the_room_freed_is_given() -> None:
    """The pass after one item of a long map ended: one core free, ten thousand items queued.
    It places the first and looks at no more than the one after it."""
    fleet = WorkerIndex([worker("w1", caps(cpu_cores=2), busy_cores=1)])
    one_core = job(cpu_cores=1)
    queue = [QueuedJob(f"j{i:05d}", one_core, float(i)) for i in range(10_000)]
    taken = [0]
    result = plan_pass(_counted(queue, taken), fleet, now=100.0, first_in_first_out=True)
    assert [a.job_id for a in result.assignments] == ["j00000"]
    assert taken[0] <= 2
    assert fleet.with_free_cores == 0


def test_a_full_pool_still_gives_the_starving_job_its_reservation() -> None:
    """No core is free, but the oldest job has waited past the starvation limit: the pass
    goes on until that job holds its reservation, then stops."""
    fleet = WorkerIndex([worker("w1", caps(cpu_cores=2), busy_cores=2)])
    queue = [QueuedJob(f"j{i:05d}", job(cpu_cores=1), float(i)) for i in range(1_000)]
    taken = [0]
    result = plan_pass(
        _counted(queue, taken), fleet, now=400.0, starvation_seconds=300, first_in_first_out=True
    )
    assert result.assignments == []
    assert result.reservation == Reservation("j00000", "w1")
    assert taken[0] <= 2


def _small_fleet(rng: random.Random, *, with_random: bool) -> list[WorkerSnapshot]:
    """A few CPU workers whose cores run out (and, ``with_random``, two random ones)."""
    fleet = [
        worker(f"c{i}", caps(cpu_cores=rng.choice([2, 4, 8])), busy_cores=rng.choice([0, 1]))
        for i in range(rng.randint(1, 4))
    ]
    return fleet + (random_fleet(rng, 2, kinds=2) if with_random else [])


def _fifo_queue(rng: random.Random, ids: list[str], spread: float) -> list[QueuedJob]:
    jobs = (
        QueuedJob(f"j{i:04d}", random_job(rng, ids), rng.uniform(0, spread)) for i in range(300)
    )
    return sorted(jobs, key=lambda q: (q.enqueued_at, q.job_id))


@pytest.mark.parametrize("seed", range(12))
def test_stopping_early_places_what_a_pass_over_the_whole_queue_places(seed: int) -> None:
    """Against the same pass made to look at every job (its index told a core is always
    free somewhere): the same assignments and the same reservation."""
    rng = random.Random(seed)
    fleet = _small_fleet(rng, with_random=seed % 3 == 0)
    queue = _fifo_queue(rng, [w.id for w in fleet], 1000)
    now = rng.choice([500.0, 1000.0, 2000.0])
    whole = WorkerIndex(fleet)
    whole.with_free_cores += 10**9  # never zero: the pass looks at every job
    reference = plan_pass(queue, whole, now=now, starvation_seconds=700)
    taken = [0]
    stopping = plan_pass(
        _counted(queue, taken),
        WorkerIndex(fleet),
        now=now,
        starvation_seconds=700,
        first_in_first_out=True,
    )
    assert stopping.assignments == reference.assignments
    assert stopping.reservation == reference.reservation
    # The job it stopped before was handed to it, not looked at.
    assert stopping.decisions <= taken[0] <= stopping.decisions + 1


def test_passes_over_fleets_whose_cores_run_out_do_stop_early() -> None:
    """The comparison above is not empty: where the cores run out, passes stop early."""
    stopped = 0
    for seed in range(12):
        rng = random.Random(seed)
        fleet = _small_fleet(rng, with_random=False)
        queue = _fifo_queue(rng, [w.id for w in fleet], 100)
        result = plan_pass(queue, WorkerIndex(fleet), now=200.0, first_in_first_out=True)
        stopped += result.decisions < len(queue)
    assert stopped >= 6
