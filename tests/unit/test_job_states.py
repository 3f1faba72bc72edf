"""The job and attempt state tables, and moves through them on a real SQLite store."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulayer.control.job_states import ATTEMPT_TRANSITIONS, JOB_TRANSITIONS, JobStates, sources
from gpulayer.control.store import TERMINAL_STATES, Store


def test_ended_states_lead_nowhere_and_every_live_state_can_end() -> None:
    for table in (JOB_TRANSITIONS, ATTEMPT_TRANSITIONS):
        for state, targets in table.items():
            if state in TERMINAL_STATES:
                assert targets == frozenset()
            else:
                assert targets & TERMINAL_STATES, state
            assert targets <= set(table)


def test_sources_of_a_state() -> None:
    assert sources(JOB_TRANSITIONS, "queued") == ["provisioning", "running"]
    assert sources(ATTEMPT_TRANSITIONS, "running") == ["assigned"]
    with pytest.raises(ValueError):
        sources(JOB_TRANSITIONS, "paused")


def queue_job(store: Store, job_id: str) -> None:
    store.insert_job(
        job_id=job_id,
        name="j",
        spec={},
        state="queued",
        target="remote",
        working_dir=None,
        has_bundle=False,
        labels={},
    )


@pytest.fixture
def store(tmp_path: Path) -> Store:
    made = Store(f"sqlite:///{tmp_path / 'state.db'}")
    made.upsert_worker(worker_id="w-1", name="w", kind="remote", labels={}, capabilities={})
    queue_job(made, "j-1")
    return made


def test_a_finished_job_never_moves_again(store: Store) -> None:
    states = JobStates(store)
    assert states.move_job("j-1", "cancelled", reason="cancelled")
    for target in ("queued", "running", "failed", "succeeded"):
        assert not states.move_job("j-1", target)
    assert store.get_job("j-1").state == "cancelled"
    assert store.get_job("j-1").finished_at is not None


def test_an_attempt_never_stays_live_under_an_ended_job(store: Store) -> None:
    states = JobStates(store)
    attempt = store.assign("j-1", "w-1", [])
    assert attempt is not None and states.move_attempt(attempt.id, "running")
    assert states.move_job("j-1", "failed", reason="worker_lost", message="controller stopped")
    ended = store.get_attempt(attempt.id)
    assert (ended.state, ended.reason) == ("failed", "worker_lost")
    assert ended.finished_at is not None
    assert not states.move_attempt(attempt.id, "succeeded")


def test_a_pass_of_assignments_answers_each_in_its_order_and_wins_a_job_once(
    store: Store,
) -> None:
    for n in range(2, 151):  # more than one transaction's worth
        queue_job(store, f"j-{n}")
    store.upsert_worker(worker_id="w-2", name="w2", kind="remote", labels={}, capabilities={})
    JobStates(store).move_job("j-77", "cancelled", reason="cancelled")  # no longer queued
    plans = [(f"j-{n}", [("w-1", [])]) for n in range(150, 0, -1)]
    plans.insert(10, ("j-3", [("w-2", [])]))  # planned twice: the first one wins it
    plans.append(("j-5", [("w-1", [0]), ("w-2", [1])]))  # a gang, but j-5 is taken already
    results = store.assign_all(plans)
    assert len(results) == len(plans)
    won = {job for (job, _), got in zip(plans, results, strict=True) if got is not None}
    assert won == {f"j-{n}" for n in range(1, 151)} - {"j-77"}
    first_j3, second_j3 = (
        got for (job, _), got in zip(plans, results, strict=True) if job == "j-3"
    )
    assert first_j3 is not None and [a.worker_id for a in first_j3] == ["w-2"]
    assert second_j3 is None
    assert results[-1] is None
    assert all(len(store.attempts_for(f"j-{n}")) == (n != 77) for n in range(1, 151))
