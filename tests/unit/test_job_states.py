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


@pytest.fixture
def store(tmp_path: Path) -> Store:
    made = Store(f"sqlite:///{tmp_path / 'state.db'}")
    made.upsert_worker(worker_id="w-1", name="w", kind="remote", labels={}, capabilities={})
    made.insert_job(
        job_id="j-1",
        name="j",
        spec={},
        state="queued",
        target="remote",
        working_dir=None,
        has_bundle=False,
        labels={},
    )
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
