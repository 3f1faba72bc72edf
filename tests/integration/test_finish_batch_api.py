"""One request ends several of a worker's attempts, each checked as if it came alone: the
worker's own current attempts are recorded, a ended one is stale, another worker's and one
with unstorable text are refused, and a credential cannot report for another worker.

Through the real API app (FastAPI's test client) on a real SQLite store."""

from __future__ import annotations

from typing import Any

import pytest

from gpulayer.control.claim_poll import claim_blocking
from gpulayer.control.service import ControlService
from tests.integration.test_dashboard_http import ADMIN, plane
from tests.unit.test_scheduler_builders import caps

__all__ = ["plane"]  # the fixture, shared with the dashboard's tests


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _join(client: Any, name: str) -> tuple[str, str]:
    join = client.post("/v1/tokens", json={"kind": "worker"}, headers=_bearer(ADMIN)).json()
    body = {"name": name, "capabilities": caps(cpu_cores=8).model_dump(mode="json")}
    reply = client.post("/v1/workers", json=body, headers=_bearer(join["token"])).json()
    return reply["worker_id"], reply["token"]


def _running(client: Any, service: ControlService, worker: str, token: str, n: int) -> list[Any]:
    for _ in range(n):
        service.submissions.submit(
            {
                "workload": {"kind": "command", "command": ["true"]},
                "placement": {"target": "remote", "worker_ids": [worker]},
            }
        )
    found = client.post(
        f"/v1/workers/{worker}/claim", params={"signals": 1}, headers=_bearer(token)
    ).json()["assignments"]
    assert len(found) == n
    return found


def _report(attempt_id: int, **fields: Any) -> dict[str, Any]:
    return {"attempt_id": attempt_id, "report": {"state": "succeeded", "exit_code": 0, **fields}}


def test_each_report_in_a_batch_is_judged_alone(plane: tuple[Any, ControlService]) -> None:
    client, service = plane
    a, a_token = _join(client, "a")
    b, b_token = _join(client, "b")
    ended, kept, dirty, last = _running(client, service, a, a_token, 4)
    (other,) = _running(client, service, b, b_token, 1)
    first = client.post(
        f"/v1/attempts/{ended['attempt_id']}/finish",
        json=_report(ended["attempt_id"])["report"],
        headers=_bearer(a_token),
    )
    assert first.status_code == 200  # ended already: a second report of it is stale
    batch = [
        _report(ended["attempt_id"]),
        _report(kept["attempt_id"], logs=[["stdout", "kept-line\n"]]),
        _report(other["attempt_id"]),
        _report(dirty["attempt_id"], message="bad\u0000text"),
        _report(last["attempt_id"]),
    ]
    answer = client.post(
        f"/v1/workers/{a}/finish", json={"reports": batch}, headers=_bearer(a_token)
    )
    assert answer.status_code == 200, answer.text
    outcomes = [(r["attempt_id"], r["outcome"]) for r in answer.json()["results"]]
    assert outcomes == [
        (ended["attempt_id"], "stale"),
        (kept["attempt_id"], "recorded"),
        (other["attempt_id"], "refused"),
        (dirty["attempt_id"], "refused"),
        (last["attempt_id"], "recorded"),
    ]
    assert "NUL" in answer.json()["results"][3]["detail"]
    state = {j: service.store.get_job(j).state for j in (kept["job_id"], last["job_id"])}
    assert state == {kept["job_id"]: "succeeded", last["job_id"]: "succeeded"}
    assert service.store.get_job(other["job_id"]).state == "running"  # b's job untouched
    assert service.store.get_job(dirty["job_id"]).state == "running"
    lines = [line.text for line in service.store.read_logs(kept["job_id"])]
    assert "kept-line\n" in lines


def test_a_worker_credential_reports_for_its_own_worker_only(
    plane: tuple[Any, ControlService],
) -> None:
    client, service = plane
    _, a_token = _join(client, "a")
    b, b_token = _join(client, "b")
    (theirs,) = _running(client, service, b, b_token, 1)
    answer = client.post(
        f"/v1/workers/{b}/finish",
        json={"reports": [_report(theirs["attempt_id"])]},
        headers=_bearer(a_token),
    )
    assert answer.status_code == 403
    assert service.store.get_job(theirs["job_id"]).state == "running"


@pytest.mark.parametrize("reports", [[], [_report(1)] * 501, [{"attempt_id": -1}]])
def test_a_malformed_batch_is_refused_whole(
    plane: tuple[Any, ControlService], reports: list[Any]
) -> None:
    client, _ = plane
    a, a_token = _join(client, "a")
    answer = client.post(
        f"/v1/workers/{a}/finish", json={"reports": reports}, headers=_bearer(a_token)
    )
    assert answer.status_code == 422
    assert "reports" in answer.text


@pytest.mark.parametrize("ending", ["succeeded", "failed"])
def test_a_local_jobs_environment_is_forgotten_once_its_finish_ends_it(
    plane: tuple[Any, ControlService], ending: str
) -> None:
    """The submitter's environment a local job starts from is kept in memory only while the
    job may still start: the finish that ends the job drops it."""
    from gpulayer.protocol.messages import AttemptReport

    _, service = plane
    service.store.upsert_worker(
        worker_id="w-local", name="local", kind="local", labels={}, capabilities={"cpu_cores": 2}
    )
    spec = {"workload": {"kind": "command", "command": ["true"]}, "placement": {"target": "local"}}
    job = service.submissions.submit(
        spec, client_env={"PATH": "/usr/bin", "HF_TOKEN": "kept-in-memory"}
    )
    assert job.target == "local"
    (assignment,) = claim_blocking(service.claims, "w-local", 0).assignments
    assert service.environments.job_environment(job.id) == {
        "PATH": "/usr/bin",
        "HF_TOKEN": "kept-in-memory",
    }
    report = AttemptReport(
        state=ending, reason=None if ending == "succeeded" else "exit_code", exit_code=0
    )
    (outcome,) = service.reports.finish_attempts("w-local", [(assignment.attempt_id, report)])
    assert outcome.outcome == "recorded"
    assert service.store.get_job(job.id).state == ending
    assert service.environments.job_environment(job.id) is None


def test_a_batch_of_ends_is_one_write_and_each_attempt_moves_once(
    plane: tuple[Any, ControlService],
) -> None:
    """Jobs of one node ending as reported are recorded in one write transaction: every
    outcome, log line and job state as one report at a time gave, an attempt reported twice
    recorded once, and a job ended meanwhile by another path not moved by its late report."""
    from sqlalchemy import event

    client, service = plane
    a, a_token = _join(client, "a")
    first, twice, cancelled, failed = _running(client, service, a, a_token, 4)
    # Ended as a timeout or another control plane would end it: its attempt ends with it.
    service.states.move_job(cancelled["job_id"], "cancelled", only_from=["running"])
    begun: list[str] = []
    event.listen(
        service.store.engine,
        "before_cursor_execute",
        lambda _c, _k, statement, *_: (
            begun.append(statement) if statement.startswith(("UPDATE", "INSERT")) else None
        ),
    )
    commits: list[object] = []
    event.listen(service.store.engine, "commit", lambda conn: commits.append(conn))
    batch = [
        _report(first["attempt_id"], logs=[["stdout", "first-line\n"]]),
        _report(twice["attempt_id"]),
        _report(twice["attempt_id"], logs=[["stdout", "second-report\n"]]),
        _report(cancelled["attempt_id"], logs=[["stdout", "late-line\n"]]),
        _report(failed["attempt_id"], state="failed", exit_code=3, message="boom"),
    ]
    answer = client.post(
        f"/v1/workers/{a}/finish", json={"reports": batch}, headers=_bearer(a_token)
    )
    assert answer.status_code == 200, answer.text
    assert [r["outcome"] for r in answer.json()["results"]] == [
        "recorded",
        "recorded",
        "stale",
        "stale",
        "recorded",
    ]
    assert len(commits) == 1  # the dispatch pass after the batch writes nothing here
    assert begun and all("attempts" in s or "jobs" in s or "log" in s for s in begun)
    jobs = {j: service.store.get_job(j) for j in (first["job_id"], twice["job_id"])}
    assert {job.state for job in jobs.values()} == {"succeeded"}
    bad = service.store.get_job(failed["job_id"])
    assert (bad.state, bad.exit_code, bad.message) == ("failed", 3, "boom")
    assert service.store.get_job(cancelled["job_id"]).state == "cancelled"
    assert [x.text for x in service.store.read_logs(first["job_id"])] == ["first-line\n"]
    assert "second-report\n" not in [x.text for x in service.store.read_logs(twice["job_id"])]
    assert "late-line\n" not in [x.text for x in service.store.read_logs(cancelled["job_id"])]
    states = [a.state for j in jobs for a in service.store.attempts_for(j)]
    assert states == ["succeeded", "succeeded"]
