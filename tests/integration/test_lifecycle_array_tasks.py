"""A job array's task record waits for the launch that makes its array's call (a real SQLite
store, the pass's own gathering): while that launch may have made the call (its record is
launching, say after a restart cut it off) the task is not ended as never launched, however
long it waited; once that launch is gone without a call, the task ends with it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer.cloud.lifecycle.arrays import ARRAY_LAUNCH_TAG, ARRAY_TASK_TAG
from gpulayer.cloud.lifecycle.decide import Move, decide
from gpulayer.cloud.lifecycle.sync import Local, gather
from gpulayer.control.cloud_gate import NoCloud
from gpulayer.control.paths import HomeLayout
from gpulayer.control.service import ControlService
from gpulayer.control.store import Store


@pytest.fixture()
def service(tmp_path: Path) -> Iterator[ControlService]:
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    yield ControlService(store, HomeLayout(tmp_path / "home").ensure(), cloud=NoCloud())
    store.close()


def _tasks(service: ControlService) -> tuple[str, str]:
    """Two jobs of one array, each with its task's record (requested), the first's launch
    making the array's call."""
    jobs = [
        service.submissions.submit(
            {
                "workload": {"kind": "command", "command": ["true"]},
                "placement": {"target": "remote"},
            }
        )
        for _ in range(2)
    ]
    rows = [
        {
            "request_id": f"r-task{index}",
            "job_id": job.id,
            "owner": "o-test",
            "provider": "slurm",
            "region": "lab/cpu",
            "state": "requested",
            "hourly_price": 1.0,
            "currency": "USD",
            "spot": False,
            "tags": {ARRAY_LAUNCH_TAG: "r-task0", ARRAY_TASK_TAG: str(index)},
        }
        for index, job in enumerate(jobs)
    ]
    service.store.record_instances(rows)
    return "r-task0", "r-task1"


def _decided(service: ControlService, request_id: str, now: float) -> list[object]:
    records = service.store.list_instances(live_only=True)
    nothing = Local(in_flight=lambda key: False, link_alive=lambda rid: False)
    facts = dict(
        zip(
            (r.request_id for r in records),
            gather(service.store, records, now, {}, nothing),
            strict=True,
        )
    )
    return list(decide(facts[request_id], now, deadman_seconds=600.0))


def test_a_task_waits_while_its_arrays_call_may_have_been_made(service: ControlService) -> None:
    first, task = _tasks(service)
    assert service.store.move_instance(first, expect="requested", to="launching", reason="test")
    much_later = time.time() + 3_600
    # The first task's launch (cut off) is started again; the other task waits for it.
    assert _decided(service, task, much_later) == []


def test_a_task_whose_arrays_call_never_started_ends_unlaunched(service: ControlService) -> None:
    _, task = _tasks(service)
    much_later = time.time() + 3_600
    # Neither started: the requested limit ends both, nothing was created.
    (move,) = _decided(service, task, much_later)
    assert isinstance(move, Move) and move.to == "never_launched"
