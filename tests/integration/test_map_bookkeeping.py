"""Each item of a long map as a job of its own, against a real SQLite store in process: a
worker that claims again at its capacity is answered without a look at the store, yet every
assignment and every cancel still reaches it; each item keeps its own attempt and outcome;
a worker that restarts mid-map loses only the items it was running, and every other item
runs exactly once."""

from __future__ import annotations

import threading
from pathlib import Path

from sqlalchemy import event

from gpulayer.control.claim_poll import claim_blocking
from gpulayer.control.service import ControlService
from gpulayer.protocol.messages import AttemptReport
from tests.integration.test_live_placement import plane, register
from tests.unit.test_scheduler_builders import caps

ITEM = {
    "workload": {"kind": "function", "entrypoint": "items:square", "args": [3]},
    "placement": {"target": "remote"},
    "resources": {"cpu_cores": 1},
}
DONE = AttemptReport(state="succeeded", exit_code=0, result=9)


def _claim_looks(service: ControlService) -> list[str]:
    """The reads a claim's look makes (a worker's attempts with their jobs' cancels), from
    here on."""
    seen: list[str] = []

    def note(_c: object, _k: object, statement: str, *_: object) -> None:
        if "job_cancel_requested" in statement:
            seen.append(statement)

    event.listen(service.store.engine, "before_cursor_execute", note)
    return seen


def _claim(service: ControlService, worker: str) -> tuple[list[int], list[int]]:
    """One look, as the local worker's link takes it: (attempt ids, cancels)."""
    reply = claim_blocking(service.claims, worker, 0, with_cancels=True)
    return [a.attempt_id for a in reply.assignments], reply.cancel_attempts


def _submit(service: ControlService, count: int) -> list[str]:
    return [j.id for j in service.submissions.submit_many([(dict(ITEM), None, None)] * count)]


def test_a_claim_at_capacity_reads_nothing_until_news(tmp_path: Path) -> None:
    service = plane(tmp_path)
    worker = register(service, "w", caps(cpu_cores=2))
    jobs = _submit(service, 10)
    first, _ = _claim(service, worker)
    assert len(first) == 2
    reads = _claim_looks(service)
    assert _claim(service, worker) == ([], [])  # at its capacity: nothing new
    assert reads == []  # and the store was not asked
    service.reports.finish_attempts(worker, [(first[0], DONE)])  # its pass places the next
    taken, _ = _claim(service, worker)
    assert len(taken) == 1 and taken[0] not in first
    assert len(reads) == 1  # the news made it look
    attempts = [service.store.attempts_for(job_id) for job_id in jobs[:3]]
    # Each item its own job and its own first attempt, started once.
    assert sorted([(a.number, a.state) for a in each] for each in attempts) == [
        [(1, "running")],
        [(1, "running")],
        [(1, "succeeded")],
    ]
    assert len({each[0].id for each in attempts}) == 3


def test_a_cancel_reaches_a_worker_that_looked_a_moment_ago(tmp_path: Path) -> None:
    service = plane(tmp_path)
    worker = register(service, "w", caps(cpu_cores=2))
    jobs = _submit(service, 4)
    taken, _ = _claim(service, worker)
    assert _claim(service, worker) == ([], [])
    service.jobs.cancel(jobs[1])
    (attempt,) = service.store.attempts_for(jobs[1])
    assert attempt.id in taken
    assert _claim(service, worker) == ([], [attempt.id])
    assert _claim(service, worker) == ([], [])  # told once


def test_a_worker_restarted_mid_map_loses_only_what_it_ran(tmp_path: Path) -> None:
    """Its new life looks at once (a new epoch), takes the items still queued, and the old
    life's late reports are refused: every item ends once, the two it was running as lost."""
    service = plane(tmp_path)
    worker = register(service, "w", caps(cpu_cores=2))
    jobs = _submit(service, 6)
    old, _ = _claim(service, worker)
    assert _claim(service, worker) == ([], [])
    register(service, "w", caps(cpu_cores=2), worker_id=worker)  # the same worker, restarted
    outcomes = service.reports.finish_attempts(worker, [(old[0], DONE)])
    assert [o.outcome for o in outcomes] == ["stale"]
    ran: list[int] = []
    while len(ran) < 4:
        taken, _ = _claim(service, worker)
        assert taken, "the new life is given the queued items"
        ran += taken
        service.reports.finish_attempts(worker, [(a, DONE) for a in taken])
    ended = {j.id: j for j in service.store.get_jobs(jobs)}
    states = sorted((ended[j].state, ended[j].reason) for j in jobs)
    assert states[:2] == [("failed", "worker_lost")] * 2
    assert [s for s, _ in states[2:]] == ["succeeded"] * 4
    for job_id in jobs:
        attempts = service.store.attempts_for(job_id)
        assert len(attempts) == 1  # no item ran twice
        assert ended[job_id].attempts == 1
    assert not set(old) & set(ran)


def test_a_follower_of_one_job_sleeps_through_the_other_items_ends(tmp_path: Path) -> None:
    """Waiting for the map's last item (as fn.map's wait does, past every log line), its
    follower reads the job's log when that job is placed and when it ends, not each time
    another item ends (it did before); and it is answered once its job has ended."""
    service = plane(tmp_path)
    worker = register(service, "w", caps(cpu_cores=2))
    jobs = _submit(service, 12)
    looks: list[str] = []

    def note(_c: object, _k: object, statement: str, *_: object) -> None:
        if statement.startswith("SELECT logs."):
            looks.append(statement)

    event.listen(service.store.engine, "before_cursor_execute", note)
    answer: list[str] = []
    follower = threading.Thread(
        target=lambda: answer.append(
            service.jobs.read_logs(jobs[-1], after=2**31 - 1, wait=60)[1].state
        )
    )
    follower.start()
    ended = 0
    while ended < len(jobs):
        taken, _ = _claim(service, worker)
        assert taken, "the pass after each end placed the next items"
        service.reports.finish_attempts(worker, [(a, DONE) for a in taken])
        ended += len(taken)
    follower.join(10)
    assert answer == ["succeeded"]
    # Its first look, its job placed, its job ended (ten other items ended meanwhile).
    assert len(looks) <= 3, looks
