"""The lifecycle's steps in flight, backoffs and holds live in the store: a second controller
on the same store sees a step the first one runs, a controller that died holds its steps back
only until their leases expire, and a restarted one finds every wait where it was left.

Real control services on a real SQLite file; the steps are plain functions gated by events."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpulayer.cloud.lifecycle import reconciler as lifecycle
from gpulayer.cloud.lifecycle.decide import jobs_to_plan
from gpulayer.control.paths import HomeLayout
from gpulayer.control.service import ControlService
from gpulayer.control.store import Store


def _until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _controller(store: Store, home: Path) -> lifecycle.Reconciler:
    service = ControlService(store, HomeLayout(home).ensure())
    return lifecycle.Reconciler(
        service.cloud_moves,
        control_port=0,
        owner="o-test",
        load_providers=lambda only: {},
        settings=dict,
    )


@pytest.fixture()
def two(tmp_path: Path) -> Iterator[tuple[lifecycle.Reconciler, lifecycle.Reconciler]]:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    first, second = Store(url), Store(url)
    a, b = _controller(first, tmp_path / "a"), _controller(second, tmp_path / "b")
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()
        first.close()
        second.close()


def test_a_step_one_controller_runs_is_in_flight_for_the_other(
    two: tuple[lifecycle.Reconciler, lifecycle.Reconciler],
) -> None:
    a, b = two
    started, release = threading.Event(), threading.Event()
    ran_on_b: list[str] = []

    def hangs() -> None:
        started.set()
        release.wait(10)

    a._submit("r-1", hangs)
    assert started.wait(5)
    now = time.time()
    assert b._local(now).in_flight("r-1")
    assert not b._local(now).in_flight("end:r-1")  # its teardown is free
    b._submit("r-1", lambda: ran_on_b.append("r-1"))
    assert b.store.leased_keys(time.time()) == {"r-1"}
    release.set()
    _until(lambda: not b.store.leased_keys(time.time()), "a's lease to end with its step")
    assert ran_on_b == []  # b never started what a ran
    b._submit("r-1", lambda: ran_on_b.append("r-1"))
    _until(lambda: ran_on_b == ["r-1"], "b to run the step once it is free")


def test_a_lease_its_controller_stopped_renewing_ends_at_its_expiry(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    try:
        assert store.take_lease("launch:r-1", "dead", now=100.0, expires_at=120.0)
        assert not store.take_lease("launch:r-1", "alive", now=119.0, expires_at=139.0)
        assert store.leased_keys(119.0) == {"launch:r-1"}
        store.renew_leases(["dead"], 125.0)  # its last pass
        assert not store.take_lease("launch:r-1", "alive", now=124.0, expires_at=144.0)
        assert store.leased_keys(126.0) == set()
        assert store.take_lease("launch:r-1", "alive", now=126.0, expires_at=146.0)
        store.drop_leases([("launch:r-1", "dead")])  # the dead one's end changes nothing
        assert store.leased_keys(130.0) == {"launch:r-1"}
        store.drop_leases([("launch:r-1", "alive")])
        assert store.leased_keys(130.0) == set()
    finally:
        store.close()


def test_a_stopped_controller_frees_its_steps_for_the_next_one(
    two: tuple[lifecycle.Reconciler, lifecycle.Reconciler],
) -> None:
    a, b = two
    release = threading.Event()
    a._submit("launch:r-2", lambda: release.wait(10))
    assert b._local(time.time()).in_flight("launch:r-2")
    a.stop()  # a clean stop: the next controller takes over at once, as after a restart
    assert not b._local(time.time()).in_flight("launch:r-2")
    release.set()


def test_waits_for_capacity_survive_a_restart(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    store = Store(url)
    store.wait_for_capacity_until("j-wait", 105.0)
    store.wait_for_capacity_until("j-other", 90.0)
    store.wait_for_capacity_until("j-wait", 110.0)  # a later backoff replaces the first
    store.close()
    again = Store(url)
    try:
        waits = again.capacity_waits()
        assert waits == {"j-wait": 110.0, "j-other": 90.0}
        waiting = [("j-wait", "cloud"), ("j-other", "cloud")]
        assert jobs_to_plan(waiting, set(), waits, now=100.0) == ["j-other"]
        again.end_capacity_waits(["j-other"])
        assert again.capacity_waits() == {"j-wait": 110.0}
        again.end_capacity_waits()  # capacity freed: every job looks again
        assert again.capacity_waits() == {}
    finally:
        again.close()


def test_an_instances_check_and_reclaim_times_are_columns(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    store = Store(url)
    store.insert_job(
        job_id="j-1",
        name="one",
        spec={},
        state="running",
        target="cloud",
        working_dir=None,
        has_bundle=False,
        labels={},
    )
    store.record_instance(
        request_id="r-1", job_id="j-1", owner="o", provider="ssh", state="in_use", tags={}
    )
    store.update_instance("r-1", checked_at=50.0, reclaimed_at=60.0, next_step_at=70.0)
    store.close()
    again = Store(url)
    try:
        record = again.get_instance("r-1")
        assert (record.checked_at, record.reclaimed_at, record.next_step_at) == (50.0, 60.0, 70.0)
    finally:
        again.close()
