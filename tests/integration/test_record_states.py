"""Workers and reservations move only as their tables allow, on a real SQLite store."""

from __future__ import annotations

from pathlib import Path

from gpulayer.control.store import Store


def store_with_worker(tmp_path: Path) -> Store:
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    store.upsert_worker(worker_id="w-1", name="w1", kind="remote", labels={}, capabilities={})
    return store


def test_a_retired_workers_late_heartbeat_does_not_bring_it_back(tmp_path: Path) -> None:
    store = store_with_worker(tmp_path)
    before = store.get_worker("w-1").last_heartbeat
    assert store.move_worker("w-1", "gone")
    store.worker_heartbeat("w-1")
    after = store.get_worker("w-1")
    assert after.state == "gone" and after.last_heartbeat >= before
    assert not store.move_worker("w-1", "ready") and not store.move_worker("w-1", "lost")
    # Registering again starts a new epoch, ready.
    again = store.upsert_worker(
        worker_id="w-1", name="w1", kind="remote", labels={}, capabilities={}
    )
    assert (again.state, again.epoch) == ("ready", 2)
    store.close()


def test_a_lost_worker_that_heartbeats_is_ready_again(tmp_path: Path) -> None:
    store = store_with_worker(tmp_path)
    assert store.move_worker("w-1", "lost")
    assert not store.move_worker("w-1", "lost")  # already there: no move to make
    store.worker_heartbeat("w-1")
    assert store.get_worker("w-1").state == "ready"
    store.credit_worker_silence("w-1")
    assert store.get_worker("w-1").state == "ready"
    store.close()


def test_a_released_reservation_is_never_bound_again(tmp_path: Path) -> None:
    store = store_with_worker(tmp_path)
    job_id = _job(store)
    store.record_instance(
        reason="test",
        request_id="r-1",
        job_id=job_id,
        owner="o",
        provider="ssh",
        state="requested",
        tags={},
    )
    store.release_reservation("r-1")
    assert not store.bind_reservation("r-1", "w-1")
    reservation = store.reservation("r-1")
    assert reservation is not None and (reservation.state, reservation.worker_id) == (
        "released",
        None,
    )
    store.close()


def _job(store: Store) -> str:
    return store.insert_job(
        job_id="j-1",
        name="one",
        spec={},
        state="queued",
        target="cloud",
        working_dir=None,
        has_bundle=False,
        labels={},
    ).id
