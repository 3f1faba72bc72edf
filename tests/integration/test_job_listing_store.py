"""Listing jobs by state in the store, on SQLite and PostgreSQL: newest first across every state
asked for, the id breaking ties of one creation time, ``limit`` rows at most, each state's rows
read through its index in order rather than all of them sorted."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import event, update

from gpulayer.control import tables as t
from gpulayer.control.store import Store


def _job(job_id: str, state: str) -> dict[str, object]:
    return {
        "job_id": job_id,
        "name": job_id,
        "spec": {},
        "state": state,
        "target": "remote",
        "working_dir": None,
        "has_bundle": False,
        "labels": {},
    }


def test_jobs_of_several_states_come_newest_first_up_to_the_limit(
    tmp_path: Path, database_url: str | None
) -> None:
    store = Store(database_url or f"sqlite:///{tmp_path / 'state.db'}")
    try:
        layout = [  # id, state, created_at: ties at 3.0 go by id, highest first
            ("j-a", "queued", 1.0),
            ("j-b", "running", 2.0),
            ("j-c", "succeeded", 5.0),
            ("j-d", "queued", 3.0),
            ("j-e", "running", 3.0),
            ("j-f", "provisioning", 4.0),
            ("j-g", "queued", 0.5),
        ]
        store.insert_jobs([_job(job_id, state) for job_id, state, _ in layout])
        with store.engine.begin() as conn:
            for job_id, _, created in layout:
                conn.execute(update(t.jobs).where(t.jobs.c.id == job_id).values(created_at=created))
        live = ["queued", "provisioning", "running"]
        assert [j.id for j in store.list_jobs(states=live, limit=10)] == [
            "j-f",
            "j-e",
            "j-d",
            "j-b",
            "j-a",
            "j-g",
        ]
        assert [j.id for j in store.list_jobs(states=live, limit=3)] == ["j-f", "j-e", "j-d"]
        assert [j.id for j in store.list_jobs(states=["queued"], limit=1)] == ["j-d"]
        assert store.list_jobs(states=["cancelled"], limit=5) == []
        assert [j.id for j in store.list_jobs(limit=2)] == ["j-c", "j-f"]

        statements: list[str] = []
        event.listen(store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
        store.list_jobs(states=live, limit=1)
        # One statement a state, each naming its one state (an IN over all three sorts them).
        assert len(statements) == 3 and not any(" IN " in s.upper() for s in statements)
    finally:
        store.close()
