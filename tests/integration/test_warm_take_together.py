"""A gang takes its warm machines all at once or not at all (a real SQLite store): when one of
the machines is no longer idle, none is taken, so no half of a gang ever holds idle machines;
when all are, each is the gang's node in the given order under one launch id, and each holder
keeps its share on the ledger."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer.control.cloud_gate import NoCloud
from gpulayer.control.paths import HomeLayout
from gpulayer.control.service import ControlService
from gpulayer.control.store import Store


@pytest.fixture()
def service(tmp_path: Path) -> Iterator[ControlService]:
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    yield ControlService(store, HomeLayout(tmp_path / "home").ensure(), cloud=NoCloud())
    store.close()


def _machine(store: Store, name: str, *, idle: bool) -> str:
    """A fleet's machine (no job) whose worker joined, idle or still being made a worker."""
    request_id = f"r-{name}"
    store.record_instances(
        [
            {
                "request_id": request_id,
                "job_id": "",
                "fleet": "pool",
                "owner": "o-test",
                "provider": "ssh",
                "region": "lab",
                "state": "requested",
                "hourly_price": 1.0,
                "currency": "USD",
                "spot": False,
                "tags": {},
            }
        ]
    )
    for before, after in (("requested", "launching"), ("launching", "booting")):
        assert store.move_instance(request_id, expect=before, to=after, reason="test")
    store.update_instance(request_id, launched_at=1.0)
    if idle:
        for before, after in (("booting", "bootstrapping"), ("bootstrapping", "ready")):
            assert store.move_instance(request_id, expect=before, to=after, reason="test")
        assert store.bind_reservation(request_id, f"w-{name}")
        assert store.rest_reservation(request_id)
        assert store.move_instance(request_id, expect="ready", to="idle", reason="test")
    return request_id


def test_a_gang_takes_its_machines_all_at_once_or_none(service: ControlService) -> None:
    store = service.store
    job = service.submissions.submit(
        {"workload": {"kind": "command", "command": ["true"]}, "placement": {"target": "remote"}}
    )
    first, second = _machine(store, "a", idle=True), _machine(store, "b", idle=False)
    assert not store.take_idle_instances([first, second], job.id, reason="gang")
    untouched = store.get_instance(first)
    assert untouched.state == "idle" and untouched.job_id == ""
    assert store.reservation(first).state == "idle"  # type: ignore[union-attr]
    assert not [i for i in store.list_instances() if i.state == "handed_over"]

    third = _machine(store, "c", idle=True)
    assert store.take_idle_instances([third, first], job.id, reason="gang")
    taken = [store.get_instance(rid) for rid in (third, first)]
    assert [(i.state, i.job_id, i.node_rank, i.launch_id) for i in taken] == [
        ("ready", job.id, 0, third),
        ("ready", job.id, 1, third),
    ]
    assert {store.reservation(rid).state for rid in (third, first)} == {"bound"}  # type: ignore[union-attr]
    shares = [i for i in store.list_instances() if i.state == "handed_over"]
    assert len(shares) == 2 and {(s.job_id, s.fleet) for s in shares} == {("", "pool")}
