"""The index as a cache over the feasibility checks: the same answers as the plain checks after
any sequence of changes, and first stages judged once per class and requirement key."""

from __future__ import annotations

import random
from typing import Any

import pytest

from gpulayer.scheduler import (
    CHECKS,
    Placement,
    WorkerIndex,
    WorkerSnapshot,
    check,
    place_by_scan,
    reasons_never,
    reasons_now,
)
from gpulayer.scheduler.feasibility import Condition, key_reader
from gpulayer.scheduler.gpus import device_meets
from gpulayer.spec import JobSpec
from gpulayer.spec.models import PlacementPolicy, ResourceRequest
from tests.unit.test_scheduler_builders import (
    A10G,
    A100_80,
    cuda_caps,
    job,
    random_caps,
    random_fleet,
    random_job,
    random_worker,
    worker,
)


def _closest_by_scan(spec: JobSpec, workers: list[WorkerSnapshot], exclude: set[str]) -> str | None:
    """What WorkerIndex.closest promises, from the plain checks and nothing of the index."""
    r = spec.resources
    best: tuple[Any, ...] | None = None
    for w in workers:
        if not w.ready or w.id in exclude or reasons_never(spec, w):
            continue
        free = [d for d in w.capabilities.gpus if d.index in w.free_gpus]
        usable = sum(1 for d in free if device_meets(r, d))
        key = (
            max(r.gpus - usable, 0),
            max(r.cpu_cores - w.free_cpu_cores, 0.0),
            max((r.memory_gb or 0.0) - (w.host_memory_free or 0.0), 0.0),
            w.running,
            w.id,
        )
        if best is None or key < best:
            best = key
    return None if best is None else str(best[-1])


def _assert_same_as_plain_checks(
    index: WorkerIndex, jobs: list[JobSpec], rng: random.Random
) -> int:
    workers = list(index)
    placed = 0
    for spec in jobs:
        expected = place_by_scan(spec, workers)
        assert index.choose(spec) == expected, spec.model_dump(exclude_defaults=True)
        assert index.could_ever_run(spec) == any(not reasons_never(spec, w) for w in workers)
        exclude = set(rng.sample([w.id for w in workers], min(5, len(workers))))
        assert index.closest(spec, exclude=exclude) == _closest_by_scan(spec, workers, exclude)
        placed += expected is not None
    spec = jobs[0]
    explanation = index.explain(spec)
    for w in workers:
        assert explanation.now[w.id] == reasons_now(spec, w)
        assert explanation.never[w.id] == reasons_never(spec, w)
    return placed


@pytest.mark.parametrize("seed", range(4))
def test_answers_equal_the_plain_checks_through_every_kind_of_change(seed: int) -> None:
    rng = random.Random(900 + seed)
    templates = [random_caps(rng) for _ in range(30)]
    index = WorkerIndex(
        random_worker(rng, f"w{i:04d}", rng.choice(templates[:8])) for i in range(90)
    )
    running: list[tuple[JobSpec, Placement]] = []
    next_id = 1000
    placed_total = 0
    for _round in range(12):
        ids = [w.id for w in index]
        # Ask first, so the class cache holds keys that the changes below must keep right.
        placed_total += _assert_same_as_plain_checks(
            index, [random_job(rng, ids) for _ in range(15)], rng
        )
        for _ in range(10):
            move = rng.random()
            target = rng.choice(ids)
            if move < 0.15 and len(ids) > 10:  # a worker disappears
                index.remove(target)
                ids.remove(target)
                running = [(s, p) for s, p in running if p.worker_id != target]
            elif move < 0.3:  # a worker registers, often of a class never seen before
                next_id += 1
                new = random_worker(rng, f"w{next_id:04d}", rng.choice(templates))
                index.add(new)
                ids.append(new.id)
            elif move < 0.45:  # a worker comes back with other hardware or software
                current = index.get(target)
                index.update(random_worker(rng, target, rng.choice(templates)))
                assert index.get(target).capabilities is not current.capabilities
                running = [(s, p) for s, p in running if p.worker_id != target]
            elif move < 0.6:  # heartbeat news: state, labels, load
                index.update(random_worker(rng, target, index.get(target).capabilities))
                running = [(s, p) for s, p in running if p.worker_id != target]
            elif move < 0.85:  # an attempt starts
                spec = random_job(rng, ids)
                placement = index.choose(spec)
                if placement is not None:
                    index.assign(spec, placement)
                    running.append((spec, placement))
            elif running:  # an attempt ends
                spec, placement = running.pop(rng.randrange(len(running)))
                index.release(spec, placement)
    assert placed_total > 30


def test_a_whole_class_leaving_and_coming_back_is_judged_again() -> None:
    a10g = [worker(f"a{i}", cuda_caps(A10G, 1)) for i in range(3)]
    a100 = worker("b0", cuda_caps(A100_80, 1))
    index = WorkerIndex([*a10g, a100])
    big = job(accelerator="cuda", gpu_memory_gb=40)
    assert index.choose(big) == Placement("b0", (0,))
    index.remove("b0")
    assert index.group_count == 1 and index.choose(big) is None
    assert not index.could_ever_run(big)
    index.add(worker("b1", cuda_caps(A100_80, 1)))
    assert index.choose(big) == Placement("b1", (0,))


def _counting_check(calls: list[str]) -> Any:
    @check("counted", "static")
    def counted(spec: JobSpec, w: WorkerSnapshot) -> str | None:
        calls.append(w.id)
        return None

    return counted


def test_first_stages_run_once_per_class_and_key_and_follow_what_changed() -> None:
    calls: list[str] = []
    rng = random.Random(5)
    fleet = random_fleet(rng, 400, kinds=12)
    index = WorkerIndex(fleet, extra_checks=[_counting_check(calls)])
    classes = index.group_count
    spec = job(cpu_cores=1)
    index.choose(spec)
    judged = len(calls)
    assert judged <= classes  # once per class at most (a class may be left out earlier)
    for _ in range(20):
        index.choose(job(cpu_cores=1, strategy=rng.choice(["spread", "first_fit"])))
    assert len(calls) == judged  # the same key again costs no first stage
    # Load changes and new workers of known classes cost none either.
    for w in fleet[:50]:
        index.update(random_worker(rng, w.id, w.capabilities))
    index.add(random_worker(rng, "new-known", fleet[0].capabilities))
    index.choose(spec)
    assert len(calls) == judged
    # A new class costs one first stage for the cached key, when it next asks.
    index.add(worker("new-class", cuda_caps(A100_80, 3, cpu_cores=7)))
    assert len(calls) == judged
    index.choose(spec)
    assert calls[judged:] == ["new-class"]
    # Another key is judged once per class.
    index.choose(job(cpu_cores=2))
    assert len(calls) <= judged + 1 + index.group_count


@pytest.mark.parametrize("seed", range(3))
def test_conditions_keep_the_bounds_the_index_prunes_by(seed: int) -> None:
    rng = random.Random(300 + seed)
    fleet = random_fleet(rng, 80)
    checked = 0
    for _ in range(150):
        spec = random_job(rng)
        for w in rng.sample(fleet, 10):
            for chk in CHECKS:
                if chk.scope == "identity":
                    continue
                verdict = chk.verdict(spec, w)
                if chk.scope == "static":
                    assert not isinstance(verdict, Condition), chk.name
                if not isinstance(verdict, Condition):
                    continue
                checked += 1
                below = (
                    (verdict.ready and not w.ready)
                    or len(w.free_gpus) < verdict.gpus
                    or w.free_cpu_cores < verdict.cores
                )
                if below:
                    assert not verdict.holds(w), chk.name
                # One decision path: the reason is asked for only when the test fails.
                assert (chk(spec, w) is None) == verdict.holds(w)
    assert checked > 500


def test_every_request_field_is_read_by_some_check() -> None:
    # A field no check declares would not be in the requirement key, and two jobs differing
    # only there would share a class verdict. The profile is resolved into the other fields;
    # gpu_slices speaks of rented offers only (a worker reports the devices it has).
    read = {path for chk in CHECKS for path in chk.reads}
    resources = {p.split(".", 1)[1] for p in read if p.startswith("resources.")}
    assert resources == set(ResourceRequest.model_fields) - {"profile", "gpu_slices"}
    placement = {p.split(".", 1)[1] for p in read if p.startswith("placement.")}
    assert {"providers", "regions", "worker_ids", "worker_labels"} == placement
    assert placement <= set(PlacementPolicy.model_fields)


def test_jobs_differing_only_in_fields_no_check_reads_share_a_key_and_reasons() -> None:
    rng = random.Random(11)
    fleet = random_fleet(rng, 40)
    key = key_reader(CHECKS)
    for _ in range(100):
        spec = random_job(rng)
        data = spec.model_dump(mode="json", exclude_none=True)
        data["name"] = f"other-{rng.randrange(1000)}"
        data["labels"] = {"team": "t9"}
        data["workload"] = {"kind": "command", "command": ["python", "other.py"]}
        data["placement"]["strategy"] = rng.choice(["spread", "first_fit", "most_free_memory"])
        other = JobSpec.model_validate(data)
        assert key(other) == key(spec)
        for w in fleet:
            assert reasons_now(other, w) == reasons_now(spec, w)
        bigger = data | {"resources": data["resources"] | {"cpu_cores": 1000}}
        assert key(JobSpec.model_validate(bigger)) != key(spec)


def test_a_remembered_fit_key_is_the_key_read_afresh_for_every_spec() -> None:
    """The index remembers each spec's fit key for the next pass: past its limit too, and for
    specs made and dropped in turn (whose objects may reuse an earlier one's id), every key
    it gives is the one the plain key reader gives."""
    rng = random.Random(7)
    index = WorkerIndex(random_fleet(rng, 5))
    fresh = key_reader(index.checks)
    kept = [random_job(rng) for _ in range(50)]
    for _ in range(3):
        for spec in kept:
            assert index.fit_key(spec) == fresh(spec)
    for _ in range(9000):
        spec = random_job(rng)
        assert index.fit_key(spec) == fresh(spec)
        del spec
    assert all(index.fit_key(spec) == fresh(spec) for spec in kept)
