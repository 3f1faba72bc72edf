"""The dispatch pass's queue, kept in memory between whole reads, against a real SQLite store
in process: a pass over a long queue reads none of it from the store; what another control
plane queued is placed at the next whole read; a job noted as queued that another control
plane took is refused by the store and its room goes to the next job at once; a job put back
in the queue is placed again in its turn."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import event

from gpulayer.control.claim_poll import claim_blocking
from gpulayer.control.service import ControlService
from gpulayer.protocol.messages import AttemptReport
from tests.integration.test_live_placement import plane, register
from tests.support.elsewhere import queue_elsewhere
from tests.unit.test_scheduler_builders import caps

SMALL = {
    "workload": {"kind": "command", "command": ["true"]},
    "placement": {"target": "remote"},
    "resources": {"cpu_cores": 1},
}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _statements(service: ControlService, prefix: str) -> list[str]:
    """The statements starting with ``prefix`` that the store runs from here on."""
    seen: list[str] = []

    def note(_c: object, _k: object, statement: str, *_: object) -> None:
        if statement.startswith(prefix):
            seen.append(statement)

    event.listen(service.store.engine, "before_cursor_execute", note)
    return seen


def _queue_reads(service: ControlService) -> list[str]:
    """Statements that read the queue whole, from here on."""
    return _statements(service, "SELECT jobs.id, jobs.target, jobs.created_at")


def _plane_with_clock(tmp_path: Path) -> tuple[ControlService, Clock]:
    service = plane(tmp_path)
    clock = Clock()
    service.placement._clock = clock
    return service, clock


def test_passes_over_a_long_queue_read_none_of_it_between_whole_reads(tmp_path: Path) -> None:
    service, clock = _plane_with_clock(tmp_path)
    worker = register(service, "w", caps(cpu_cores=4))
    jobs = service.submissions.submit_many([(dict(SMALL), None, None) for _ in range(300)])
    reads = _queue_reads(service)
    for _ in range(20):
        finished = claim_blocking(service.claims, worker, 0).assignments
        assert finished, "each pass placed the next jobs in line"
        report = AttemptReport(state="succeeded", exit_code=0)
        service.reports.finish_attempts(worker, [(a.attempt_id, report) for a in finished])
    assert reads == []  # twenty passes, none of them read the queue
    placed = [j.id for j in service.store.get_jobs([j.id for j in jobs]) if j.state != "queued"]
    assert placed == [j.id for j in jobs[: len(placed)]]  # in their order, none skipped
    assert len(placed) == 4 * 21
    clock.now += service.placement.queue_full_every
    service.dispatcher.dispatch()
    assert len(reads) == 1  # due again: read whole once


def _job_row_reads(service: ControlService) -> list[str]:
    """Statements that read whole job rows (a spec among them), from here on."""
    return _statements(service, "SELECT jobs.id, jobs.name, jobs.spec")


def test_jobs_this_plane_stored_are_placed_without_reading_their_rows(tmp_path: Path) -> None:
    """A submit hands its validated spec to the dispatch pass: placing the job reads no job
    row, only the submit's reply reads its fresh state (before: the new row was also read
    back at once, then read and validated again by the pass)."""
    service, _ = _plane_with_clock(tmp_path)
    worker = register(service, "w", caps(cpu_cores=3))
    service.dispatcher.dispatch()  # the first pass reads the queue whole
    reads = _job_row_reads(service)
    singles = [service.submissions.submit(dict(SMALL)).id for _ in range(2)]
    assert len(reads) == 2  # each reply's fresh state
    many = service.submissions.submit_many([(dict(SMALL), None, None) for _ in range(40)])
    assert len(reads) == 3  # the reply's fresh states, in one read
    assert [a.job_id for a in claim_blocking(service.claims, worker, 0).assignments] == [
        *singles,
        many[0].id,
    ]
    for _ in range(3):
        running = service.store.active_attempts(worker)
        report = AttemptReport(state="succeeded", exit_code=0)
        before = len(reads)
        service.reports.finish_attempts(worker, [(a.id, report) for a in running])
        assert len(reads) == before  # nor did the pass that placed the list's next jobs
        claim_blocking(service.claims, worker, 0)  # (a claim reads the specs it hands over)
    states = [j.state for j in service.store.get_jobs([j.id for j in many])]
    assert states[:10] == ["succeeded"] * 7 + ["running"] * 3 and set(states[10:]) == {"queued"}


def test_a_job_another_control_plane_queued_is_placed_at_the_next_whole_read(
    tmp_path: Path,
) -> None:
    service, clock = _plane_with_clock(tmp_path)
    worker = register(service, "w", caps(cpu_cores=4))
    service.dispatcher.dispatch()  # the first pass reads the queue whole
    queue_elsewhere(service.store, "j-elsewhere", SMALL)
    service.dispatcher.dispatch()
    assert service.store.get_job("j-elsewhere").state == "queued"  # not read yet
    clock.now += service.placement.queue_full_every
    service.dispatcher.dispatch()
    assert service.store.get_job("j-elsewhere").state == "running"
    assert [a.job_id for a in service.store.active_attempts(worker)] == ["j-elsewhere"]


def test_a_job_taken_elsewhere_gives_its_room_to_the_next_job_at_once(tmp_path: Path) -> None:
    service, _ = _plane_with_clock(tmp_path)
    worker = register(service, "w", caps(cpu_cores=1))
    running, taken, waiting = service.submissions.submit_many(
        [(dict(SMALL), None, None) for _ in range(3)]
    )
    (first,) = claim_blocking(service.claims, worker, 0).assignments
    assert first.job_id == running.id
    # Another control plane cancels the next job in line: this one still holds it as queued.
    assert service.store.update_job(taken.id, expect_states=["queued"], state="cancelled")
    report = AttemptReport(state="succeeded", exit_code=0)
    service.reports.finish_attempts(worker, [(first.attempt_id, report)])
    assert service.store.get_job(taken.id).state == "cancelled"  # the store refused it
    assert service.store.get_job(waiting.id).state == "running"  # in the same call


def test_a_job_put_back_in_the_queue_is_placed_again_in_its_turn(tmp_path: Path) -> None:
    service, _ = _plane_with_clock(tmp_path)
    worker = register(service, "w", caps(cpu_cores=1))
    spec = dict(SMALL, retry={"max_attempts": 2, "retry_on": ["preempted"]})
    retried, later = service.submissions.submit_many(
        [(spec, None, None), (dict(SMALL), None, None)]
    )
    (first,) = claim_blocking(service.claims, worker, 0).assignments
    assert first.job_id == retried.id
    lost = AttemptReport(state="failed", reason="preempted", message="reclaimed")
    service.reports.finish_attempts(worker, [(first.attempt_id, lost)])
    assert service.store.get_job(retried.id).state == "queued"
    service.workers.heartbeat(worker)  # ready again after the reclaim
    service.dispatcher.dispatch()
    (second,) = claim_blocking(service.claims, worker, 0).assignments
    assert second.job_id == retried.id  # ahead of the later job: its place is its time
    assert service.store.get_job(later.id).state == "queued"


def test_a_scheduled_run_and_a_fired_tick_are_placed_at_once(tmp_path: Path) -> None:
    """A schedule's job is stored with its run record, not through submit: the dispatch pass
    is told of it all the same, and places it without waiting for a whole read."""
    from gpulayer.control.schedule_firing import ScheduleFiring
    from gpulayer.control.schedule_service import ScheduleService

    service, _ = _plane_with_clock(tmp_path)  # the clock stands still: no whole read is due
    schedules = ScheduleService(service)
    worker = register(service, "w", caps(cpu_cores=4))
    service.dispatcher.dispatch()  # the first pass reads the queue whole
    nightly = {"name": "nightly", "cron": "0 3 * * *", "job": SMALL, "concurrency": "allow"}
    record, _ = schedules.apply(nightly)
    triggered = schedules.trigger("nightly")
    assert service.store.get_job(triggered).state == "running"
    schedules.store.update_schedule(record.id, watermark=time.time() - 2 * 86400)
    firing = ScheduleFiring(schedules)
    firing.started_at = time.time()
    firing.run_pass(time.time())
    fired = [a.job_id for a in service.store.active_attempts(worker)]
    assert len(fired) == 2 and triggered in fired


def test_with_a_dispatcher_a_finish_is_answered_before_the_pass_it_asked_for(
    tmp_path: Path,
) -> None:
    """A server makes passes on a thread of their own: the request carrying a worker's
    finishes writes them and returns; the pass that gives their room to the next jobs runs
    beside it (before: in the request, which kept the worker's next batch waiting)."""
    import threading

    service, _ = _plane_with_clock(tmp_path)
    worker = register(service, "w", caps(cpu_cores=2))
    jobs = service.submissions.submit_many([(dict(SMALL), None, None) for _ in range(4)])
    running = claim_blocking(service.claims, worker, 0).assignments
    assert sorted(a.job_id for a in running) == sorted(j.id for j in jobs[:2])
    assigns_by_thread: list[int] = []

    def note(_c: object, _k: object, statement: str, *_: object) -> None:
        if statement.startswith("INSERT INTO attempts"):
            assigns_by_thread.append(threading.get_ident())

    event.listen(service.store.engine, "before_cursor_execute", note)
    stop = service.dispatcher.start()
    try:
        report = AttemptReport(state="succeeded", exit_code=0)
        outcomes = service.reports.finish_attempts(
            worker, [(a.attempt_id, report) for a in running]
        )
        assert [o.outcome for o in outcomes] == ["recorded", "recorded"]
        deadline = time.monotonic() + 30
        while len(service.store.active_attempts(worker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(a.job_id for a in service.store.active_attempts(worker)) == sorted(
            j.id for j in jobs[2:]
        )
        assert assigns_by_thread and threading.get_ident() not in assigns_by_thread
    finally:
        stop()
