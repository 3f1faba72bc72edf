"""Warm interpreters on a team server's worker: a real `gpulayer server` and `gpulayer worker
start` on loopback, the source shipped as a bundle. Items of one function share a process
whichever way the worker keeps an attempt's processes (a cgroup per attempt, or a subreaper
and tags where it has no cgroup v2), run as the worker's one run-as user, and a worker whose
attempts each get a uid of their own runs each item in a process of its own."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import gpulayer as gl
from tests.support.procs import process_ended
from tests.support.servers import (
    ADMIN_TOKEN,
    ServerProcess,
    WorkerProcess,
    reachable_interpreter,
    wait_for_workers,
    without_cgroup_v2,
)

SUPPORT = Path(__file__).resolve().parent.parent / "support" / "warm_functions.py"
ONE_AT_A_TIME = os.cpu_count() or 1

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the workers' containment needs root"),
]


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder every user can reach (pytest's own tree is closed to others)."""
    base = Path(tempfile.mkdtemp(prefix="gpulayer-warm-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@contextmanager
def server_and_worker(
    base: Path, monkeypatch: pytest.MonkeyPatch, *extra: str, wrapper: tuple[str, ...] = ()
) -> Iterator[Path]:
    """A server and one worker; the SDK pointed at the server; the user's source folder."""
    server = ServerProcess(base / "server").start()
    worker = None
    try:
        token = server.client().request("POST", "/v1/tokens", {"kind": "worker"})["token"]
        worker = WorkerProcess(server.url, token, base / "worker", "w", wrapper=wrapper)
        worker.start(0.5, "--work-dir", str(base / "work"), *extra)
        wait_for_workers(server.client(), 1)
        source = base / "src"
        source.mkdir()
        shutil.copy(SUPPORT, source / "warm_items.py")
        (source / "data.txt").write_text("shipped beside the module\n")
        monkeypatch.setenv("GPULAYER_SERVER", server.url)
        monkeypatch.setenv("GPULAYER_TOKEN", ADMIN_TOKEN)
        monkeypatch.chdir(source)
        yield source
    finally:
        if worker is not None:
            worker.stop()
        server.stop()


def run_items(source: Path, name: str, calls: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    builders = [
        gl.function(f"warm_items:{name}", *args)
        .source(str(source))
        .override(cpu_cores=ONE_AT_A_TIME, target="remote")
        for args in calls
    ]
    return [job.wait(timeout=120) for job in gl.launch_many(builders)]


@pytest.mark.parametrize("cgroups", [True, False], ids=["cgroup", "subreaper"])
def test_items_share_a_process_and_a_crash_or_a_leftover_ends_only_its_own(
    open_dir: Path, monkeypatch: pytest.MonkeyPatch, cgroups: bool
) -> None:
    wrapper = () if cgroups else without_cgroup_v2()
    with server_and_worker(open_dir, monkeypatch, wrapper=wrapper) as source:
        seen = run_items(source, "seen", [(i,) for i in range(3)])
        assert [s["state"] for s in seen] == ["succeeded"] * 3, seen
        results = [s["result"] for s in seen]
        assert len({r["pid"] for r in results}) == 1
        assert [r["calls"] for r in results] == [1, 2, 3]
        # The module was imported from a copy that outlives the first item's folder.
        assert [r["beside"] for r in results] == ["shipped beside the module\n"] * 3
        assert all(r["leaked"] is None and r["left_in_cwd"] == [] for r in results)

        crashed = run_items(source, "crash", [(i, "segv") for i in range(3)])
        assert [s["state"] for s in crashed] == ["succeeded", "failed", "succeeded"]
        assert "killed by SIGSEGV" in crashed[1]["message"]
        assert crashed[0]["result"]["pid"] != crashed[2]["result"]["pid"]

        marker = open_dir / "left.pid"
        left = run_items(source, "leaves", [(i, str(marker)) for i in range(3)])
        assert [s["state"] for s in left] == ["succeeded"] * 3, left
        assert process_ended(int(marker.read_text()), 10)
        assert left[0]["result"]["pid"] == left[1]["result"]["pid"] != left[2]["result"]["pid"]


def test_a_run_as_user_runs_the_warm_process(
    open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with server_and_worker(
        open_dir, monkeypatch, "--run-as", "nobody", wrapper=reachable_interpreter()
    ) as source:
        seen = run_items(source, "seen", [(i,) for i in range(3)])
        assert [s["state"] for s in seen] == ["succeeded"] * 3, seen
        results = [s["result"] for s in seen]
        assert len({r["pid"] for r in results}) == 1
        assert {r["uid"] for r in results} == {pwd.getpwnam("nobody").pw_uid}


def test_a_uid_per_attempt_runs_each_item_in_a_process_of_its_own(
    open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with server_and_worker(open_dir, monkeypatch, "--run-as-range", "61100-61109") as source:
        seen = run_items(source, "seen", [(i,) for i in range(3)])
        assert [s["state"] for s in seen] == ["succeeded"] * 3, seen
        results = [s["result"] for s in seen]
        assert len({r["pid"] for r in results}) == 3
        assert [r["calls"] for r in results] == [1, 1, 1]
        assert all(61100 <= r["uid"] <= 61109 for r in results)
