"""Function jobs of one function run in warm interpreters: the items of ``fn.map`` and
``launch_many`` share a worker process, one item at a time, through the real local control
plane and its worker. Each item stays a job of its own (its attempt, outcome, logs, outputs
and environment), and whatever ends a process (a crash, a timeout, a cancel) ends only the
item it was running.

Items are made to run one at a time (each asks for every core of the machine), so which
item ran in which process is known."""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import gpulayer as gl
from gpulayer.sdk.job import Job
from tests.support.procs import process_ended

SUPPORT = Path(__file__).resolve().parent.parent / "support" / "warm_functions.py"
ONE_AT_A_TIME = os.cpu_count() or 1

pytestmark = pytest.mark.slow


@pytest.fixture
def source(tmp_path: Path) -> Iterator[Path]:
    """A folder of the user's own with the functions, as a script's folder would be."""
    folder = tmp_path / "src"
    folder.mkdir()
    shutil.copy(SUPPORT, folder / "warm_items.py")
    yield folder


@pytest.fixture
def items(source: Path) -> Iterator[ModuleType]:
    sys.path.insert(0, str(source))
    sys.modules.pop("warm_items", None)
    try:
        yield importlib.import_module("warm_items")
    finally:
        sys.path.remove(str(source))
        sys.modules.pop("warm_items", None)


def launched(source: Path, name: str, calls: list[tuple[Any, ...]], **options: Any) -> list[Job]:
    builders = [
        gl.function(f"warm_items:{name}", *args)
        .source(str(source))
        .override(cpu_cores=ONE_AT_A_TIME, **options)
        for args in calls
    ]
    return gl.launch_many(builders)


def test_map_items_share_a_warm_process_and_keep_their_own_job(items: ModuleType) -> None:
    seen = gl.remote(cpu_cores=ONE_AT_A_TIME)(items.seen)
    results = seen.map(range(4), timeout=240)
    assert [r["item"] for r in results] == [0, 1, 2, 3]
    # One process ran every item, and its module-level global counted them: the module was
    # imported once.
    assert len({r["pid"] for r in results}) == 1
    assert [r["calls"] for r in results] == [1, 2, 3, 4]
    # Yet each item was a job of its own, in a folder of its own, with its own environment:
    # what an item set in os.environ or left in its working folder is not seen by the next.
    assert len({r["job"] for r in results}) == 4
    assert len({r["cwd"] for r in results}) == 4
    assert len({r["output_dir"] for r in results}) == 4
    assert all(r["leaked"] is None for r in results)
    assert all(r["left_in_cwd"] == [] for r in results)


def test_each_items_logs_and_outputs_are_its_own(source: Path) -> None:
    jobs = launched(source, "seen", [(i,) for i in range(3)])
    statuses = [job.wait(timeout=120) for job in jobs]
    assert [s["state"] for s in statuses] == ["succeeded"] * 3
    assert len({s["result"]["pid"] for s in statuses}) == 1
    for item, job in enumerate(jobs):
        logs = job.logs()
        assert f"item {item} says hello" in logs
        others = [i for i in range(3) if i != item]
        assert not any(f"item {other} says hello" in logs for other in others), logs
        [artifact] = job.artifacts()
        assert artifact["path"] == "item.txt"
        assert artifact["sha256"] == hashlib.sha256(f"{item}\n".encode()).hexdigest()


@pytest.mark.parametrize("how", ["exit", "segv"])
def test_a_crash_fails_only_its_item_and_the_next_gets_a_fresh_process(
    source: Path, how: str
) -> None:
    jobs = launched(source, "crash", [(i, how) for i in range(4)])
    statuses = [job.wait(timeout=120) for job in jobs]
    states = [s["state"] for s in statuses]
    assert states == ["succeeded", "failed", "succeeded", "succeeded"], statuses
    crashed = statuses[1]
    assert crashed["reason"] == "exit_code"
    expected = "exited with code 3" if how == "exit" else "killed by SIGSEGV"
    assert expected in crashed["message"]
    assert "item 1 is about to crash" in jobs[1].logs()
    first, after = statuses[0]["result"]["pid"], statuses[2]["result"]["pid"]
    assert first != after  # the crashed process was replaced
    assert statuses[3]["result"]["pid"] == after  # and the new one is warm in turn


def _pid_in(marker: Path, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = marker.read_text() if marker.exists() else ""
        if text:
            return int(text)
        time.sleep(0.05)
    raise AssertionError(f"the item never wrote {marker}")


def test_a_timeout_kills_only_its_item(source: Path, tmp_path: Path) -> None:
    marker = tmp_path / "slow.pid"
    jobs = launched(
        source, "slow", [(i, str(marker)) for i in range(3)], timeout_seconds=4, grace_seconds=1
    )
    statuses = [job.wait(timeout=120) for job in jobs]
    assert [s["state"] for s in statuses] == ["succeeded", "failed", "succeeded"], statuses
    assert statuses[1]["reason"] == "timeout"
    killed = _pid_in(marker, 5)
    assert killed == statuses[0]["result"]["pid"]  # item 1 ran in item 0's warm process
    assert process_ended(killed, 10)
    assert statuses[2]["result"]["pid"] != killed


def test_cancel_ends_only_its_item(source: Path, tmp_path: Path) -> None:
    marker = tmp_path / "slow.pid"
    jobs = launched(source, "slow", [(i, str(marker)) for i in range(3)])
    killed = _pid_in(marker, 60)
    jobs[1].cancel()
    statuses = [job.wait(timeout=120) for job in jobs]
    assert [s["state"] for s in statuses] == ["succeeded", "cancelled", "succeeded"], statuses
    assert killed == statuses[0]["result"]["pid"]
    assert process_ended(killed, 10)
    assert statuses[2]["result"]["pid"] != killed


def test_what_an_item_leaves_running_ends_with_it_and_its_process(
    source: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "left.pid"
    jobs = launched(source, "leaves", [(i, str(marker)) for i in range(3)])
    statuses = [job.wait(timeout=120) for job in jobs]
    assert [s["state"] for s in statuses] == ["succeeded"] * 3, statuses
    assert process_ended(_pid_in(marker, 5), 10)
    # The process it was started from is not trusted with the next item.
    first, second, third = (s["result"]["pid"] for s in statuses)
    assert first == second and third != second
    assert process_ended(second, 10)


def test_an_arrays_items_share_a_warm_process_each_with_its_index(source: Path) -> None:
    from gpulayer.sdk.connection import connect

    client = connect(None).client
    spec = {
        "workload": {
            "kind": "function",
            "entrypoint": "warm_items:seen",
            "args": [7],
            "source": str(source),
        },
        "resources": {"cpu_cores": ONE_AT_A_TIME},
    }
    body = {
        "spec": spec,
        "array": {"indices": [0, 1, 2]},
        "source_dir": str(source),
        "client_env": dict(os.environ),
    }
    views = client.request("POST", "/v1/jobs", body)
    statuses = [Job(client, view["id"]).wait(timeout=120) for view in views]
    assert [s["state"] for s in statuses] == ["succeeded"] * 3, statuses
    results = [s["result"] for s in statuses]
    assert len({r["pid"] for r in results}) == 1
    assert sorted(r["index"] for r in results) == ["0", "1", "2"]


@pytest.mark.parametrize("one_request", [True, False], ids=["one-list", "one-each"])
def test_each_item_gets_the_environment_it_was_submitted_from(
    source: Path, monkeypatch: pytest.MonkeyPatch, one_request: bool
) -> None:
    from gpulayer.sdk import submission

    monkeypatch.setenv("WARM_LEAK", "from-the-shell")
    if not one_request:
        # A list over the request's size budget goes one job a request, as it did before.
        monkeypatch.setattr(submission, "_LIST_BUDGET", 0)
    jobs = launched(source, "seen", [(i,) for i in range(3)])
    statuses = [job.wait(timeout=120) for job in jobs]
    assert [s["state"] for s in statuses] == ["succeeded"] * 3, statuses
    assert [s["result"]["leaked"] for s in statuses] == ["from-the-shell"] * 3
    assert len({s["result"]["pid"] for s in statuses}) == 1


def test_an_item_that_forges_an_answer_fails_and_its_process_is_not_reused(
    source: Path,
) -> None:
    jobs = launched(source, "forge", [(i,) for i in range(3)])
    statuses = [job.wait(timeout=120) for job in jobs]
    assert [s["state"] for s in statuses] == ["succeeded", "failed", "succeeded"], statuses
    assert statuses[0]["result"]["pid"] != statuses[2]["result"]["pid"]
