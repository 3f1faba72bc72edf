"""What a lifecycle step found is stored with its instance, and what used to live in a
controller's memory is read from the store: a second controller (or a restart) on the same
file reads the last step's result and its backoff, the workers whose tunnels a restarted
controller is to reopen, when capacity was last freed, and whether a reap is due.

Real control services and reconcilers on a real SQLite file; no provider is enabled, so the
steps that run are the ones that need none (a terminate that finds its provider gone)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpulayer.cloud.lifecycle import reconciler as lifecycle
from gpulayer.cloud.lifecycle.steps import reap
from gpulayer.control.paths import HomeLayout
from gpulayer.control.service import ControlService
from gpulayer.control.store import Store

SPEC = {"workload": {"kind": "command", "command": ["true"]}, "placement": {"target": "cloud"}}


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


def _instance(store: Store, request_id: str, state: str, **values: object) -> None:
    job_id = f"j-{request_id}"
    store.insert_job(
        job_id=job_id,
        name=job_id,
        spec=SPEC,
        state="running",
        target="cloud",
        working_dir=None,
        has_bundle=False,
        labels={},
    )
    store.record_instance(
        request_id=request_id,
        job_id=job_id,
        owner="o-test",
        provider="aws",
        state=state,
        tags={},
        **values,
    )


@pytest.fixture()
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'state.db'}"


@pytest.fixture()
def two(url: str, tmp_path: Path) -> Iterator[tuple[lifecycle.Reconciler, lifecycle.Reconciler]]:
    first, second = Store(url), Store(url)
    a, b = _controller(first, tmp_path / "a"), _controller(second, tmp_path / "b")
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()
        first.close()
        second.close()


def test_a_failed_terminate_leaves_its_result_and_backoff_for_the_other_controller(
    two: tuple[lifecycle.Reconciler, lifecycle.Reconciler],
) -> None:
    a, b = two
    _instance(a.store, "r-end", "terminating", instance_id="i-1")  # type: ignore[arg-type]
    a.reconcile_once()  # its provider is not enabled: the terminate fails and backs off
    _until(lambda: b.store.get_instance("r-end").last_step == "terminate", "the stored result")
    record = b.store.get_instance("r-end")
    result = record.step_result
    assert result is not None and result.outcome == "failed" and result.step == "terminate"
    assert result.error is not None and "provider aws is not enabled" in result.error.text
    assert result.not_before is not None and result.not_before > result.at
    assert record.next_step_at == pytest.approx(result.not_before)
    assert record.state == "terminating" and record.step_failures == 1
    # The other controller's pass reads the backoff from the store: it starts no terminate.
    before = record.step_at
    b.reconcile_once()
    assert "end:r-end" not in b.store.leased_keys(time.time())
    assert b.store.get_instance("r-end").step_at == before


def test_a_restarted_controllers_tunnels_to_reopen_are_a_column(
    two: tuple[lifecycle.Reconciler, lifecycle.Reconciler],
) -> None:
    a, b = two
    _instance(a.store, "r-run", "in_use", instance_id="i-2")  # type: ignore[arg-type]
    a.store.upsert_worker(
        worker_id="w-run", name="w-run", kind="remote", labels={}, capabilities={}
    )
    assert a.store.bind_reservation("r-run", "w-run")
    assert a.reconnecting_workers() == set() and b.reconnecting_workers() == set()
    a.resume()  # as at a restart: the worker's silence until its tunnel is back is ours
    assert a.reconnecting_workers() == {"w-run"}
    assert b.reconnecting_workers() == {"w-run"}  # read from the store, not a's memory
    a.store.update_instance("r-run", relink_since=None)  # what a reopened tunnel does
    assert b.reconnecting_workers() == set()


def test_capacity_freed_is_read_from_the_instances_end_times(url: str) -> None:
    store = Store(url)
    try:
        assert store.capacity_freed_at() == 0.0
        _instance(store, "r-gone", "terminating", instance_id="i-3")
        _instance(store, "r-never", "requested")
        store.move_instance(
            "r-never", expect="requested", to="never_launched", reason="refused", ended_at=50.0
        )
        assert store.capacity_freed_at() == 0.0  # nothing a provider had was ended
        store.move_instance(
            "r-gone", expect="terminating", to="terminated", reason="confirmed", ended_at=70.0
        )
    finally:
        store.close()
    again = Store(url)  # a restart reads it as it was
    try:
        assert again.capacity_freed_at() == 70.0
    finally:
        again.close()


def test_a_reap_is_due_once_a_minute_across_controllers(
    two: tuple[lifecycle.Reconciler, lifecycle.Reconciler],
) -> None:
    a, b = two
    assert reap.reap_when_due(a.steps).outcome == "done"
    assert reap.reap_when_due(b.steps).outcome == "skipped"  # a reaped within the minute
    assert reap.reap_when_due(a.steps).outcome == "skipped"
