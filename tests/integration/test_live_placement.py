"""The control plane's live worker index against a real SQLite store, in process: after any
sequence of registrations, heartbeats, losses and attempts, it holds what a full read of the
store holds; a change it was not told of never places a job where it cannot run."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from gpulayer.control.claim_poll import claim_blocking
from gpulayer.control.dispatch import LivePlacement, _pools_from
from gpulayer.control.paths import HomeLayout
from gpulayer.control.service import ControlService
from gpulayer.control.store import Store
from gpulayer.protocol.messages import AttemptReport, Registration
from gpulayer.spec.capabilities import WorkerCapabilities
from tests.unit.test_scheduler_builders import A10G, A100_80, caps, cuda_caps, random_caps


def plane(tmp_path: Path) -> ControlService:
    layout = HomeLayout(tmp_path / "home").ensure()
    service = ControlService(Store(f"sqlite:///{tmp_path / 'state.db'}"), layout)
    service.placement.full_every = 1e9  # only the first pass rebuilds, unless a test says so
    return service


def register(
    service: ControlService,
    name: str,
    capabilities: WorkerCapabilities,
    *,
    worker_id: str | None = None,
    labels: dict[str, str] | None = None,
) -> str:
    registration = Registration(
        name=name,
        kind="remote",
        worker_id=worker_id,
        labels=labels or {},
        capabilities=capabilities.model_dump(mode="json"),
    )
    worker, _ = service.workers.register_worker(registration)
    return worker.id


def submit(service: ControlService, **resources: Any) -> str:
    spec = {
        "workload": {"kind": "command", "command": ["true"]},
        "resources": resources,
        "placement": {"target": "remote"},
    }
    return service.submissions.submit(spec).id


def finish(service: ControlService, worker_id: str) -> int:
    """The worker claims what it was given and finishes one attempt; how many it finished."""
    claim_blocking(service.claims, worker_id, 0)
    running = [a for a in service.store.active_attempts(worker_id) if a.state == "running"]
    if not running:
        return 0
    service.reports.finish_attempt(running[0].id, AttemptReport(state="succeeded", exit_code=0))
    return 1


def assert_same_as_a_full_read(live: LivePlacement, store: Store) -> None:
    pools = live.pools()
    fresh = _pools_from(store)
    for kind, index in fresh.items():
        assert sorted(pools[kind], key=lambda w: w.id) == sorted(index, key=lambda w: w.id), kind


@pytest.mark.parametrize("seed", range(2))
def test_the_live_index_equals_a_full_read_after_every_change(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    service = plane(tmp_path)
    store = service.store
    templates = [cuda_caps(A10G, 2), cuda_caps(A100_80, 4), caps(cpu_cores=8)]
    templates += [random_caps(rng) for _ in range(3)]
    workers = [register(service, f"n{i}", rng.choice(templates)) for i in range(6)]
    placed = 0
    for _step in range(100):
        move = rng.random()
        target = rng.choice(workers)
        if move < 0.35:
            gpu = rng.random() < 0.5
            resources: dict[str, Any] = {"cpu_cores": rng.choice([1, 2, 4])}
            if gpu:
                resources |= {"accelerator": "cuda", "gpu_count": rng.choice([1, 2])}
            submit(service, **resources)
        elif move < 0.6:
            busy = sorted({a.worker_id for a in store.active_attempts() if a.worker_id})
            placed += finish(service, rng.choice(busy)) if busy else 0
        elif move < 0.7:  # a new worker joins
            workers.append(register(service, f"n{len(workers)}", rng.choice(templates)))
        elif move < 0.8:  # one comes back with other hardware and labels
            labels = {"pool": rng.choice(["a", "b"])}
            register(service, "again", rng.choice(templates), worker_id=target, labels=labels)
        elif move < 0.87:  # its machine is gone
            service.workers.end_worker_attempts(target, "worker_lost", "its machine went away")
        elif move < 0.93:  # a lost or gone worker heartbeats again
            running = [a.id for a in store.active_attempts(target)]
            service.workers.heartbeat(target, running)
        else:
            service.workers.sweep_lost_workers()
        assert_same_as_a_full_read(service.placement, store)
    assert placed > 10
    assert service.placement.rebuilds == 1  # everything after the first pass was incremental
    assert service.placement.refreshed > 0
    # A control plane started afresh on the same store builds the same index.
    assert_same_as_a_full_read(LivePlacement(store), store)


def test_an_attempt_it_was_not_told_of_does_not_double_book_a_gpu(tmp_path: Path) -> None:
    service = plane(tmp_path)
    store = service.store
    worker = register(service, "one-gpu", cuda_caps(A10G, 1))
    assert worker in service.placement.pools()["remote"]  # as a pass would: idle
    # Another control plane on the same store starts a job there; this one is not told.
    store.insert_job(
        job_id="j-elsewhere",
        name="elsewhere",
        spec={"resources": {"accelerator": "cuda", "gpu_count": 1, "cpu_cores": 1}},
        state="queued",
        target="elsewhere",
        working_dir=None,
        has_bundle=False,
        labels={},
    )
    assert store.assign("j-elsewhere", worker, [0]) is not None
    before = service.placement.rejected
    job = submit(service, accelerator="cuda", gpu_count=1)
    assert store.get_job(job).state == "queued"
    assert service.placement.rejected == before + 1
    gpus = sorted(g for a in store.active_attempts(worker) for g in a.gpu_indices)
    assert gpus == [0]  # GPU 0 is given once
    # The worker was read again: the next pass knows it is full and does not try.
    service.dispatcher.dispatch()
    assert service.placement.rejected == before + 1
    assert store.get_job(job).state == "queued"


def test_a_worker_lost_behind_its_back_takes_no_job(tmp_path: Path) -> None:
    service = plane(tmp_path)
    store = service.store
    worker = register(service, "soon-lost", caps(cpu_cores=4))
    assert worker in service.placement.pools()["remote"]
    store.move_worker(worker, "lost")  # not told
    job = submit(service, cpu_cores=1)
    assert store.get_job(job).state == "queued"
    assert service.placement.rejected == 1
    assert not store.active_attempts(worker)
    service.workers.heartbeat(worker)  # it is back
    service.dispatcher.dispatch()  # the next pass, as the control plane's loop makes every second
    assert store.get_job(job).state == "running"


def test_a_pass_reads_a_worker_once_when_it_read_it_before_planning(tmp_path: Path) -> None:
    """A finish makes the next pass read its worker again; the jobs that pass places there
    are checked against that read, not a second one (before: the worker and its attempts
    were read twice in the same pass)."""
    from sqlalchemy import event

    service = plane(tmp_path)
    worker = register(service, "w", caps(cpu_cores=2))
    for _ in range(4):
        submit(service, cpu_cores=1)
    running = claim_blocking(service.claims, worker, 0).assignments
    assert len(running) == 2
    reads: list[str] = []

    def note(_c: object, _k: object, statement: str, *_: object) -> None:
        if statement.startswith("SELECT workers.id, workers.name"):
            reads.append(statement)

    event.listen(service.store.engine, "before_cursor_execute", note)
    done = AttemptReport(state="succeeded", exit_code=0)
    service.reports.finish_attempts(worker, [(a.attempt_id, done) for a in running])
    assert len(reads) == 1
    assert (
        len(claim_blocking(service.claims, worker, 0).assignments) == 2
    )  # both freed cores went to the next jobs
    assert service.placement.rejected == 0


def test_the_jobs_a_pass_placed_are_counted_without_reading_their_specs(tmp_path: Path) -> None:
    """A pass knows what each job it placed takes: the next pass, reading that worker's
    attempts again, does not read those jobs' specs back (before: one read a pass)."""
    from sqlalchemy import event

    service = plane(tmp_path)
    worker = register(service, "w", caps(cpu_cores=4))
    for _ in range(8):
        submit(service, cpu_cores=1)
    first = claim_blocking(service.claims, worker, 0).assignments
    done = AttemptReport(state="succeeded", exit_code=0)
    service.reports.finish_attempts(worker, [(a.attempt_id, done) for a in first[:2]])
    spec_reads: list[str] = []

    def note(_c: object, _k: object, statement: str, *_: object) -> None:
        if statement.startswith("SELECT jobs.id, jobs.spec"):
            spec_reads.append(statement)

    event.listen(service.store.engine, "before_cursor_execute", note)
    service.reports.finish_attempts(worker, [(a.attempt_id, done) for a in first[2:]])
    assert spec_reads == []
    # And what it counted is right: the last four running, the worker full.
    running = service.store.active_attempts(worker)
    assert len(running) == 4
    assert service.placement.pools()["remote"].get(worker).free_cpu_cores == 0
    assert service.placement.rejected == 0


def test_a_periodic_rebuild_picks_up_what_no_one_noted(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    now = [1000.0]
    live = LivePlacement(store, full_every=10.0, clock=lambda: now[0])
    worker = store.upsert_worker(
        worker_id="w1",
        name="w1",
        kind="remote",
        labels={},
        capabilities=caps(cpu_cores=4).model_dump(mode="json"),
    )
    assert worker.id in live.pools()["remote"] and live.rebuilds == 1
    store.move_worker(worker.id, "gone")
    now[0] += 5
    assert worker.id in live.pools()["remote"] and live.rebuilds == 1
    now[0] += 6
    assert worker.id not in live.pools()["remote"] and live.rebuilds == 2
    live.worker_changed("w2")  # noted but never stored: read, found absent, left out
    assert "w2" not in live.pools()["remote"] and live.refreshed == 1


def test_a_gang_whose_node_no_longer_fits_is_dropped_whole(tmp_path: Path) -> None:
    service = plane(tmp_path)
    store = service.store
    first = register(service, "g0", caps(cpu_cores=4))
    second = register(service, "g1", caps(cpu_cores=4))
    assert {first, second} <= set(w.id for w in service.placement.pools()["remote"])
    store.move_worker(second, "lost")  # not told
    spec = {
        "workload": {"kind": "distributed", "entrypoint": "train.py", "num_workers": 2},
        "resources": {"cpu_cores": 2},
        "placement": {"target": "remote"},
    }
    job = service.submissions.submit(spec).id
    assert store.get_job(job).state == "queued"
    assert service.placement.rejected == 1
    assert store.attempts_for(job) == []  # no node was given out alone
    service.workers.heartbeat(second)
    service.dispatcher.dispatch()
    nodes = store.attempts_for(job)
    assert sorted(a.worker_id for a in nodes if a.worker_id) == sorted([first, second])
    assert [a.node_rank for a in nodes] == [0, 1]
