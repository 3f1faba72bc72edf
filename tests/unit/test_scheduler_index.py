"""WorkerIndex: the same answers as a scan of every worker, kept right by incremental updates."""

from __future__ import annotations

import random

import pytest

from gpulayer.scheduler import (
    Check,
    DuplicateWorker,
    UnknownWorker,
    WorkerIndex,
    check,
    place_by_scan,
    reasons_never,
    reasons_now,
)
from gpulayer.scheduler.index import PER_DEVICE_FIELDS, PER_HOST_FIELDS, signature
from gpulayer.spec.capabilities import GpuDevice, WorkerCapabilities
from tests.unit.test_scheduler_builders import (
    A10G,
    A100_80,
    caps,
    cuda_caps,
    job,
    random_fleet,
    random_job,
    random_worker,
    worker,
)


def _assert_same_as_scan(index: WorkerIndex, jobs: list) -> int:
    workers = list(index)
    placed = 0
    for spec in jobs:
        expected = place_by_scan(spec, workers)
        assert index.choose(spec) == expected, spec.model_dump(exclude_defaults=True)
        ever = any(not reasons_never(spec, w) for w in workers)
        assert index.could_ever_run(spec) == ever
        placed += expected is not None
    return placed


@pytest.mark.parametrize("seed", range(4))
def test_choose_equals_scan_on_random_fleets(seed: int) -> None:
    rng = random.Random(seed)
    fleet = random_fleet(rng, 160, kinds=rng.choice([5, 20, 60]))
    index = WorkerIndex(fleet)
    ids = [w.id for w in fleet]
    jobs = [random_job(rng, ids) for _ in range(250)]
    placed = _assert_same_as_scan(index, jobs)
    # The comparison means something only if both outcomes occur often.
    assert 25 < placed < 225


@pytest.mark.parametrize("seed", range(3))
def test_explain_equals_per_worker_reasons(seed: int) -> None:
    rng = random.Random(100 + seed)
    fleet = random_fleet(rng, 60)
    index = WorkerIndex(fleet)
    for _ in range(60):
        spec = random_job(rng, [w.id for w in fleet])
        explanation = index.explain(spec)
        for w in fleet:
            assert explanation.now[w.id] == reasons_now(spec, w)
            assert explanation.never[w.id] == reasons_never(spec, w)


@pytest.mark.parametrize("seed", range(3))
def test_incremental_updates_keep_answers_equal_to_scan(seed: int) -> None:
    rng = random.Random(200 + seed)
    templates = random_fleet(rng, 12, kinds=12)
    index = WorkerIndex(random_fleet(rng, 120, kinds=15))
    next_id = 0
    for _round in range(15):
        ids = [w.id for w in index]
        for _ in range(8):
            move = rng.random()
            target = rng.choice(ids)
            if move < 0.15:
                index.remove(target)
                ids.remove(target)
            elif move < 0.3:
                next_id += 1
                new = random_worker(rng, f"new{next_id:04d}", rng.choice(templates).capabilities)
                index.add(new)
                ids.append(new.id)
            else:
                current = index.get(target)
                # new load, state or labels, with the same capabilities object
                fresh = random_worker(rng, target, current.capabilities)
                index.update(fresh)
        jobs = [random_job(rng, ids) for _ in range(20)]
        _assert_same_as_scan(index, jobs)
        # Placing and giving back must also match a scan at every step.
        for spec in jobs[:5]:
            placement = index.choose(spec)
            if placement is not None:
                index.assign(spec, placement)
    assert len(index) == len(list(index))


def test_excluded_workers_are_skipped_like_a_scan_without_them() -> None:
    rng = random.Random(7)
    fleet = random_fleet(rng, 150, kinds=10)
    index = WorkerIndex(fleet)
    ids = [w.id for w in fleet]
    compared = 0
    for _ in range(150):
        spec = random_job(rng, ids)
        first = index.choose(spec)
        if first is None:
            continue
        exclude = {first.worker_id, *rng.sample(ids, 20)}
        rest = [w for w in fleet if w.id not in exclude]
        assert index.choose(spec, exclude=exclude) == place_by_scan(spec, rest)
        compared += 1
    assert compared > 30


def test_assign_and_release_round_trip() -> None:
    index = WorkerIndex([worker("w1", cuda_caps(count=2))])
    spec = job(accelerator="cuda", gpu_count=1, cpu_cores=4, memory_gb=10)
    first = index.choose(spec)
    assert first is not None
    index.assign(spec, first)
    second = index.choose(spec)
    assert second is not None and second.gpu_indices != first.gpu_indices
    index.assign(spec, second)
    assert index.choose(spec) is None
    after = index.release(spec, first)
    assert after.free_gpus == first.gpu_indices
    assert after.free_cpu_cores == 12 and after.free_memory_gb == 118 and after.running == 1
    assert index.choose(spec) == first


def test_workers_with_the_same_hardware_share_a_group() -> None:
    a = worker("a", cuda_caps(A100_80, 4, hostname="a", zone="x"), labels={"pool": "p"})
    b = worker("b", cuda_caps(A100_80, 4, hostname="b", zone="y"), labels={"pool": "q"})
    c = worker("c", cuda_caps(A10G, 4))
    index = WorkerIndex([a, b, c])
    assert index.group_count == 2
    index.remove("c")
    assert index.group_count == 1


def test_signature_covers_every_capability_field_but_per_host_ones() -> None:
    # A new capability field joins the signature unless it is declared per host, so checks
    # reading it stay correct; this fails if a field is neither.
    # model_copy does not validate, so a fresh object() is a value no worker reports.
    base = cuda_caps(A100_80, 2)
    for name in WorkerCapabilities.model_fields:
        if name in PER_HOST_FIELDS:
            continue
        altered = base.model_copy(update={name: object()})
        assert signature(altered) != signature(base), name
    for name in GpuDevice.model_fields:
        if name in PER_DEVICE_FIELDS:
            continue
        device = base.gpus[0].model_copy(update={name: object()})
        altered = base.model_copy(update={"gpus": [device, base.gpus[1]]})
        assert signature(altered) != signature(base), f"gpus.{name}"
    for name in PER_HOST_FIELDS:
        assert signature(base.model_copy(update={name: object()})) == signature(base), name


def test_duplicate_and_unknown_workers_are_typed_errors() -> None:
    index = WorkerIndex([worker("w1")])
    with pytest.raises(DuplicateWorker, match="w1"):
        index.add(worker("w1"))
    with pytest.raises(UnknownWorker, match="w9"):
        index.remove("w9")
    with pytest.raises(UnknownWorker, match="w9"):
        index.update(worker("w9"))


def test_capabilities_change_moves_a_worker_to_another_group() -> None:
    index = WorkerIndex([worker("w1", cuda_caps(A10G, 1)), worker("w2", cuda_caps(A10G, 1))])
    big = job(accelerator="cuda", gpu_memory_gb=40)
    assert index.choose(big) is None
    index.update(worker("w2", cuda_caps(A100_80, 1)))
    assert index.choose(big) is not None and index.choose(big).worker_id == "w2"
    assert index.group_count == 2


def test_labels_change_is_seen_by_label_placement() -> None:
    index = WorkerIndex([worker("w1", labels={"pool": "a"}), worker("w2", labels={"pool": "a"})])
    wants_b = job(placement={"worker_labels": {"pool": "b"}})
    assert index.choose(wants_b) is None
    index.update(worker("w2", labels={"pool": "b"}))
    placement = index.choose(wants_b)
    assert placement is not None and placement.worker_id == "w2"


def test_closest_prefers_the_smallest_gpu_shortfall() -> None:
    fleet = [
        worker("w1", cuda_caps(count=4), busy_gpus=(0, 1, 2)),
        worker("w2", cuda_caps(count=4), busy_gpus=(0,)),
        worker("w3", cuda_caps(count=4), busy_gpus=(0,), state="draining"),
        worker("w4", caps()),  # could never run a GPU job
    ]
    index = WorkerIndex(fleet)
    big = job(accelerator="cuda", gpu_count=4)
    assert index.choose(big) is None
    assert index.closest(big) == "w2"
    assert index.closest(big, exclude={"w2"}) == "w1"


def _only_even_ids(job_spec, w) -> str | None:
    return None if int(w.id[1:]) % 2 == 0 else "odd ids are reserved for something else"


def test_extra_checks_are_applied_by_the_index() -> None:
    even: Check = check("even_ids", "identity")(_only_even_ids)
    fleet = [worker(f"w{i}", labels={"pool": "a"}) for i in range(1, 80)]
    index = WorkerIndex(fleet, extra_checks=[even])
    for spec in (job(), job(strategy="first_fit"), job(placement={"worker_labels": {"pool": "a"}})):
        placement = index.choose(spec)
        assert placement is not None and int(placement.worker_id[1:]) % 2 == 0
        assert placement == place_by_scan(spec, fleet, index.checks)
    explanation = index.explain(job())
    assert explanation.now["w1"] == ["odd ids are reserved for something else"]
    assert explanation.never["w2"] == []


@pytest.mark.parametrize("strategy", ["spread", "first_fit", "most_free_memory"])
def test_a_crowded_top_of_the_order_still_finds_the_best_fit(strategy: str) -> None:
    # The best-ranked workers are full, so the index must look past the top of each order.
    full = [
        worker(f"a{i:02d}", cuda_caps(A100_80, 4), busy_gpus=(0, 1, 2, 3), busy_cores=15, running=0)
        for i in range(30)
    ]
    roomy = [
        worker(f"b{i:02d}", cuda_caps(A100_80, 4), busy_gpus=(0,) * (i % 2), running=3 + i % 3)
        for i in range(10)
    ]
    cpu_full = [worker(f"c{i:02d}", caps(), busy_cores=16, running=0) for i in range(30)]
    fleet = full + roomy + cpu_full
    index = WorkerIndex(fleet)
    for spec in (
        job(accelerator="cuda", strategy=strategy),
        job(accelerator="cuda", gpu_count=3, strategy=strategy),
        job(cpu_cores=4, strategy=strategy),
    ):
        expected = place_by_scan(spec, fleet)
        assert expected is not None and expected.worker_id.startswith("b")
        assert index.choose(spec) == expected
