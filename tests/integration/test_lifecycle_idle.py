"""The cloud lifecycle loop on a control plane with no cloud work: every change to jobs wakes
it, yet it asks the store nothing until a job for a cloud is stored, and then at once.

A real control service on a real SQLite store, its real lifecycle loop in its own thread;
statements are counted per thread at the SQLAlchemy engine."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from gpulayer.cloud.lifecycle import reconciler as lifecycle
from gpulayer.control.cloud_gate import NoCloud
from gpulayer.control.paths import HomeLayout
from gpulayer.control.service import ControlService
from gpulayer.control.store import Store
from tests.support.elsewhere import queue_elsewhere

LOOP_THREAD = "gpulayer-lifecycle"
REMOTE_JOB = {
    "workload": {"kind": "command", "command": ["true"]},
    "placement": {"target": "remote"},
}
CLOUD_JOB = {
    "workload": {"kind": "command", "command": ["true"]},
    "placement": {"target": "cloud"},
}


def _until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class _ProvidersSetUp(NoCloud):
    """As a control plane with a providers.yaml says: a cloud is at hand (none is reached)."""

    def available(self) -> bool:
        return True


@pytest.fixture()
def loop(tmp_path: Path) -> Iterator[tuple[ControlService, lifecycle.Reconciler, Counter[str]]]:
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    service = ControlService(store, HomeLayout(tmp_path / "home").ensure(), cloud=_ProvidersSetUp())
    statements: Counter[str] = Counter()

    def count(*_: Any) -> None:
        statements[threading.current_thread().name] += 1

    event.listen(store.engine, "before_cursor_execute", count)
    reconciler = lifecycle.Reconciler(
        service.cloud_moves,
        control_port=0,
        owner="o-test",
        load_providers=lambda only: {},
        settings=dict,
    )
    reconciler.start()
    try:
        yield service, reconciler, statements
    finally:
        reconciler.stop()
        store.close()


def test_changes_to_jobs_wake_the_loop_without_a_query_until_a_cloud_job_is_stored(
    loop: tuple[ControlService, lifecycle.Reconciler, Counter[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service, reconciler, statements = loop
    # Its first look done (both its queries: counting from between them would see the second).
    _until(lambda: reconciler._idle_since_check is not None, "the loop's first look at the store")
    # From here on only a stored cloud job may make the loop ask again.
    monkeypatch.setattr(lifecycle, "IDLE_RECHECK_SECONDS", 3600.0, raising=False)
    before = statements[LOOP_THREAD]
    for _ in range(20):
        # Queued (no worker): a change to jobs, no cloud work.
        service.submissions.submit(dict(REMOTE_JOB))
        _until(lambda: not reconciler._wake.is_set(), "the loop to take its wake")
    quiet = statements[LOOP_THREAD] - before
    cloud_job = service.submissions.submit(dict(CLOUD_JOB))
    # No provider is enabled: the loop, told of the job, plans it and finds nothing to run on.
    _until(lambda: service.store.get_job(cloud_job.id).state == "failed", "the cloud job planned")
    assert quiet == 0, f"the loop asked the store {quiet} times with no cloud work"
    assert statements[LOOP_THREAD] - before > 0
    remote = [j for j in service.store.list_jobs(limit=100) if j.target == "remote"]
    assert len(remote) == 20 and all(j.state == "queued" for j in remote)


def test_a_cloud_job_another_control_plane_stored_is_seen_at_the_next_recheck(
    loop: tuple[ControlService, lifecycle.Reconciler, Counter[str]],
) -> None:
    service, _, statements = loop
    _until(lambda: statements[LOOP_THREAD] > 0, "the loop's first look at the store")
    # Stored straight into the shared store: this control plane is told nothing of it.
    job = queue_elsewhere(service.store, "j-elsewhere", CLOUD_JOB)
    _until(lambda: service.store.get_job(job.id).state == "failed", "the job seen and planned")
