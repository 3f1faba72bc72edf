"""Assigning queued jobs in the store, on SQLite and PostgreSQL: each job once, a gang's
attempts in node-rank order with their workers' epochs, in two statements a job."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import event

from gpulayer.control.store import Store

CAPS = {"cpu_cores": 4, "memory_gb": 8, "accelerator": "cpu"}


def _store(tmp_path: Path, database_url: str | None) -> Store:
    store = Store(database_url or f"sqlite:///{tmp_path / 'state.db'}")
    for name in ("w1", "w2", "w3"):
        store.upsert_worker(worker_id=name, name=name, kind="remote", labels={}, capabilities=CAPS)
    return store


def _queue(store: Store, *job_ids: str) -> None:
    store.insert_jobs(
        [
            {
                "job_id": job_id,
                "name": job_id,
                "spec": {},
                "state": "queued",
                "target": "remote",
                "working_dir": None,
                "has_bundle": False,
                "labels": {},
            }
            for job_id in job_ids
        ]
    )


def test_a_gang_and_single_jobs_are_assigned_once_in_rank_order(
    tmp_path: Path, database_url: str | None
) -> None:
    store = _store(tmp_path, database_url)
    try:
        store.upsert_worker(worker_id="w2", name="w2", kind="remote", labels={}, capabilities=CAPS)
        epochs = {w.id: w.epoch for w in store.list_workers()}
        _queue(store, "j-gang", "j-one")
        statements: list[str] = []
        event.listen(store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))

        def writes() -> int:
            """Statements since the last call, less the transaction's own and its one read of
            the workers' epochs."""
            skipped = ("BEGIN", "COMMIT", "SELECT workers.id, workers.epoch")
            made = [s for s in statements if not s.startswith(skipped)]
            statements.clear()
            return len(made)

        (one,) = store.assign_all([("j-one", [("w2", [])])])
        assert writes() == 2  # the win with its attempt number, the attempt with its row
        (again,) = store.assign_all([("j-one", [("w1", [])])])
        assert again is None and writes() == 1  # taken already: nothing more written
        (gang_attempts,) = store.assign_all([("j-gang", [("w3", [0]), ("w1", [1]), ("w2", [])])])
        assert gang_attempts is not None and one is not None
        assert [(a.node_rank, a.worker_id, a.gpu_indices) for a in gang_attempts] == [
            (0, "w3", [0]),
            (1, "w1", [1]),
            (2, "w2", []),
        ]
        assert all(a.worker_epoch == epochs[a.worker_id] for a in [*gang_attempts, *one])
        assert {a.number for a in gang_attempts} == {1} and one[0].number == 1
        assert [j.state for j in store.get_jobs(["j-gang", "j-one"])] == ["running", "running"]
        assert store.get_job("j-gang").attempts == 1
    finally:
        store.close()
