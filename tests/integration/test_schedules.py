"""Schedules fired by real `gpulayer server` processes: each tick once, on time, across kill -9
and two servers on one PostgreSQL; concurrency policies with a job longer than the period.

Six-field crons (seconds first) keep these fast: a tick every 2 s.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from gpulayer.errors import UsageError
from gpulayer.sdk.schedule_client import ScheduleClient
from tests.e2e_cloud.journey import wait_until
from tests.support.cli import run_cli
from tests.support.servers import (
    ADMIN_TOKEN,
    ServerProcess,
    WorkerProcess,
    postgres_bin,
    postgres_cluster,
    wait_for_job,
    wait_for_workers,
)

EVERY_2S = "*/2 * * * * *"


def document(name: str, argv: list[str], **fields: Any) -> dict[str, Any]:
    job = {"workload": {"kind": "command", "command": argv}, "placement": {"target": "remote"}}
    return {"name": name, "cron": EVERY_2S, "job": job, **fields}


def tick_time(run: dict[str, Any]) -> float:
    return datetime.fromisoformat(run["tick"]).timestamp()


def created(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in runs if r["outcome"] == "created"]


def scheduled_jobs(server: ServerProcess, name: str) -> list[dict[str, Any]]:
    jobs = server.client().jobs(limit=1000)
    return [j for j in jobs if j["labels"].get("gpulayer.dev/schedule") == name]


def assert_each_tick_once(runs: list[dict[str, Any]], jobs: list[dict[str, Any]]) -> None:
    ticks = [r["tick"] for r in runs]
    assert len(ticks) == len(set(ticks)), Counter(ticks).most_common(3)
    labels = [j["labels"]["gpulayer.dev/tick"] for j in jobs]
    assert len(labels) == len(set(labels)), Counter(labels).most_common(3)
    assert {r["job_id"] for r in created(runs)} == {j["id"] for j in jobs}


def assert_no_gap(runs: list[dict[str, Any]]) -> None:
    """Every 2 s tick between the first and the last one decided is decided (run or skip)."""
    times = sorted(tick_time(r) for r in runs if not r["manual"])
    assert times, runs
    steps = {round(b - a) for a, b in itertools.pairwise(times)}
    assert steps <= {2}, sorted(times)


@pytest.fixture
def worker(server: ServerProcess, tmp_path: Path) -> Iterator[WorkerProcess]:
    token = server.client().request("POST", "/v1/tokens", {"kind": "worker"})["token"]
    process = WorkerProcess(server.url, token, tmp_path / "worker", "w0").start()
    wait_for_workers(server.client(), 1)
    yield process
    process.stop()


def test_a_schedule_every_two_seconds_fires_each_tick_once_and_on_time(
    server: ServerProcess, worker: WorkerProcess
) -> None:
    schedules = ScheduleClient(server.client())
    answer = schedules.apply(document("every2", ["python", "-c", "pass"], concurrency="allow"))
    assert answer["created"] and len(answer["schedule"]["next_ticks"]) == 5
    runs = wait_until(
        lambda: (found := schedules.runs("every2")) and len(created(found)) >= 5 and found,
        timeout=30,
        what="five runs",
    )
    made = created(runs)[-5:]  # newest first: the first five ticks
    assert_each_tick_once(runs, scheduled_jobs(server, "every2"))
    assert_no_gap(runs)
    assert all(r["late_seconds"] < 1.0 for r in made), [r["late_seconds"] for r in made]
    for run in made:
        job = wait_for_job(server.client(), run["job_id"], {"succeeded", "failed"})
        assert job["state"] == "succeeded", job
        assert job["labels"]["gpulayer.dev/schedule"] == "every2"
        assert datetime.fromisoformat(job["labels"]["gpulayer.dev/tick"]).timestamp() == (
            tick_time(run)
        )


@pytest.mark.slow
@pytest.mark.parametrize("catch_up", ["latest", "none"])
def test_kill_9_of_the_control_plane_for_7_s(tmp_path: Path, catch_up: str) -> None:
    server = ServerProcess(tmp_path / "server").start()
    try:
        schedules = ScheduleClient(server.client())
        # No worker: the jobs stay queued; what counts is which ticks made one.
        schedules.apply(document("outage", ["true"], concurrency="allow", catch_up=catch_up))
        wait_until(lambda: len(created(schedules.runs("outage"))) >= 2, 30, "two runs")
        server.kill()
        killed_at = time.time()
        time.sleep(7)  # the outage itself
        starting_at = time.time()
        server.start()
        restarted_at = time.time()
        schedules = ScheduleClient(server.client())
        runs = wait_until(
            lambda: (
                (found := schedules.runs("outage", limit=100))
                and any(tick_time(r) > restarted_at + 1 for r in created(found))
                and found
            ),
            30,
            "a tick after the restart",
        )
        jobs = scheduled_jobs(server, "outage")
    finally:
        server.stop()
    assert_each_tick_once(runs, jobs)
    assert_no_gap(runs)
    # The restarted server's first pass decides every tick it missed at once; ticks after that
    # moment are ordinary ones (under load one may come before the client saw it ready).
    first_pass = min(
        datetime.fromisoformat(r["decided_at"]).timestamp()
        for r in runs
        if datetime.fromisoformat(r["decided_at"]).timestamp() > killed_at
    )
    assert first_pass < restarted_at + 5
    # Ticks before the new process even started were missed for sure; one that fell due while
    # it started may be the newest missed tick or an ordinary one (the pass's own clock decides).
    missed = [r for r in runs if killed_at < tick_time(r) < starting_at]
    assert len(missed) >= 3, missed  # a tick every 2 s for 7 s
    made = created(missed)
    caught_up = created([r for r in runs if killed_at < tick_time(r) <= first_pass])
    if catch_up == "latest":
        assert len(made) <= 1 and len(caught_up) >= 1, runs  # one catch-up run, the newest
        if made:
            assert tick_time(made[0]) == max(tick_time(r) for r in missed)
    else:
        assert made == [], made
    assert {r["outcome"] for r in missed if r not in made} == {"catch_up"}


@pytest.mark.slow
def test_two_servers_on_one_postgresql_fire_each_tick_once(tmp_path: Path) -> None:
    if postgres_bin() is None:
        pytest.fail("PostgreSQL is not installed: .ci/run installs it (apt-get install postgresql)")
    with postgres_cluster() as url:
        first = ServerProcess(tmp_path / "a", database_url=url).start()
        second = ServerProcess(tmp_path / "b", database_url=url).start()
        try:
            schedules = ScheduleClient(first.client())
            schedules.apply(document("shared", ["true"], concurrency="allow", cron="* * * * * *"))
            # The second server sees the schedule on its next reload (5 s); from then on both
            # decide every tick and only one insert of each (schedule, tick) can win.
            wait_until(lambda: len(schedules.runs("shared")) >= 10, 40, "ten ticks")
            first.kill()  # the survivor alone goes on, without a gap
            died = time.time()
            other = ScheduleClient(second.client())
            runs = wait_until(
                lambda: (
                    (found := other.runs("shared", limit=200))
                    and sum(tick_time(r) > died for r in found) >= 3
                    and found
                ),
                30,
                "ticks after one server died",
            )
            jobs = scheduled_jobs(second, "shared")
        finally:
            first.stop()
            second.stop()
    assert_each_tick_once(runs, jobs)
    times = sorted(tick_time(r) for r in runs)
    assert {round(b - a) for a, b in itertools.pairwise(times)} == {1}  # not one tick lost
    assert {r["outcome"] for r in runs} == {"created"}
    assert "Traceback" not in (first.home / "server.log").read_text()
    assert "Traceback" not in (second.home / "server.log").read_text()


def _job_pid(marker_dir: Path, job_id: str) -> int | None:
    path = marker_dir / job_id
    return int(path.read_text()) if path.exists() else None


def _pid_running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def long_job(marker_dir: Path, seconds: float) -> list[str]:
    marker_dir.mkdir(parents=True, exist_ok=True)
    script = (
        "import os, pathlib, time; "
        f"pathlib.Path({str(marker_dir)!r}, os.environ['GPULAYER_JOB_ID'])"
        ".write_text(str(os.getpid())); "
        f"time.sleep({seconds})"
    )
    return ["python", "-c", script]


@pytest.mark.slow
def test_forbid_skips_ticks_while_a_run_is_live(
    server: ServerProcess, worker: WorkerProcess, tmp_path: Path
) -> None:
    schedules = ScheduleClient(server.client())
    schedules.apply(document("forbid", long_job(tmp_path / "pids", 5), concurrency="forbid"))
    runs = wait_until(
        lambda: (found := schedules.runs("forbid")) and len(created(found)) >= 2 and found,
        40,
        "two runs",
    )
    skipped = [r for r in runs if r["outcome"] == "concurrency"]
    assert skipped, runs
    made = sorted(created(runs), key=tick_time)
    first = wait_for_job(server.client(), made[0]["job_id"], {"succeeded", "failed"})
    assert first["state"] == "succeeded"
    # The second run started only after the first had ended.
    assert datetime.fromisoformat(made[1]["decided_at"]) >= datetime.fromisoformat(
        first["finished_at"]
    )
    between = [r for r in skipped if tick_time(made[0]) < tick_time(r) < tick_time(made[1])]
    assert between, runs  # the ticks while the first ran were skipped
    assert_each_tick_once(runs, scheduled_jobs(server, "forbid"))


@pytest.mark.slow
def test_replace_cancels_the_live_run_and_ends_its_process(
    server: ServerProcess, worker: WorkerProcess, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    schedules = ScheduleClient(server.client())
    schedules.apply(document("replace", long_job(pids, 30), concurrency="replace"))
    runs = wait_until(
        lambda: (found := schedules.runs("replace")) and len(created(found)) >= 3 and found,
        40,
        "three runs",
    )
    made = sorted(created(runs), key=tick_time)
    client = server.client()
    for older in made[:-1]:
        job = wait_for_job(client, older["job_id"], {"cancelled", "succeeded", "failed"})
        assert job["state"] == "cancelled", job
        logs = [line["text"] for line in client.logs(older["job_id"])["lines"]]
        assert any("replaced by" in text for text in logs), logs
        pid = _job_pid(pids, older["job_id"])
        if pid is not None:  # it had started: its process is ended with it
            wait_until(lambda pid=pid: not _pid_running(pid), 20, f"pid {pid} to end")
    assert {r["outcome"] for r in runs} == {"created"}  # replace never skips
    schedules.delete("replace")
    live = made[-1]["job_id"]
    client.cancel(live)
    wait_for_job(client, live, {"cancelled", "succeeded", "failed"})


@pytest.mark.slow
def test_allow_runs_overlapping_jobs(
    server: ServerProcess, worker: WorkerProcess, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    schedules = ScheduleClient(server.client())
    schedules.apply(document("allow", long_job(pids, 5), concurrency="allow"))
    client = server.client()

    def two_running() -> bool:
        jobs = scheduled_jobs(server, "allow")
        return sum(1 for j in jobs if j["state"] == "running") >= 2

    wait_until(two_running, 40, "two runs at once")
    schedules.action("allow", "pause")
    runs = schedules.runs("allow")
    assert all(r["outcome"] in ("created", "suspended") for r in runs), runs
    assert_each_tick_once(runs, scheduled_jobs(server, "allow"))
    for job in scheduled_jobs(server, "allow"):
        client.cancel(job["id"])


@pytest.mark.slow
def test_a_schedule_applied_to_a_server_ships_its_source_once_for_every_run(
    server: ServerProcess, worker: WorkerProcess, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "report.py").write_text("print('report from the bundle')\n")
    env = {"GPULAYER_SERVER": server.url, "GPULAYER_TOKEN": ADMIN_TOKEN}
    result = run_cli(
        [
            "schedule",
            "create",
            "shipped",
            "--cron",
            EVERY_2S,
            "--target",
            "remote",
            "--json",
            "--",
            "python",
            "report.py",
        ],
        env=env,
        cwd=project,
    )
    assert result.returncode == 0, result.stderr
    (project / "report.py").write_text("print('edited after apply')\n")  # runs use the snapshot
    schedules = ScheduleClient(server.client())
    runs = wait_until(
        lambda: (found := schedules.runs("shipped")) and len(created(found)) >= 2 and found,
        30,
        "two runs",
    )
    schedules.action("shipped", "pause")
    for run in created(runs)[:2]:
        job = wait_for_job(server.client(), run["job_id"], {"succeeded", "failed"})
        assert job["state"] == "succeeded", job
        lines = [line["text"] for line in server.client().logs(run["job_id"])["lines"]]
        assert any("report from the bundle" in text for text in lines), lines
    listing = run_cli(["schedule", "ls"], env=env)
    assert "shipped" in listing.stdout and "stays up" not in listing.stderr
    (kept,) = (server.home / "bundles").iterdir()  # one upload, kept by its digest
    digest = kept.name.removesuffix(".tar.gz")
    with server.store() as store:
        for run in created(runs)[:2]:
            assert store.get_job(run["job_id"]).bundle_digest == digest
    cached = [p.name for p in (tmp_path / "worker").rglob(".bundles/*.tar.gz")]
    assert cached == [kept.name]  # the worker fetched it once for every run


@pytest.mark.slow
def test_a_schedule_refuses_a_bundle_digest_the_server_lacks_naming_bundle_id(
    server: ServerProcess,
) -> None:
    schedules = ScheduleClient(server.client())
    missing = "sha256:" + "0" * 64
    with pytest.raises(UsageError, match="bundle_id") as refused:  # a 400, not a 5xx
        schedules.apply(document("lacking", ["true"]), bundle_id=missing)
    assert missing in str(refused.value)
    with pytest.raises(UsageError, match="bundle_id"):
        schedules.apply(document("lacking", ["true"]), bundle_id="sha256:not-hex")
    assert schedules.all() == []  # nothing was kept of either


@pytest.mark.slow
def test_the_bundle_a_schedule_applies_with_stays_kept_for_a_later_submit(
    server: ServerProcess, worker: WorkerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gpulayer as gl

    project = tmp_path / "project"
    project.mkdir()
    (project / "report.py").write_text("print('kept for later')\n")
    monkeypatch.chdir(project)
    monkeypatch.setenv("GPULAYER_SERVER", server.url)
    monkeypatch.setenv("GPULAYER_TOKEN", ADMIN_TOKEN)
    job = gl.command(["python", "report.py"]).placement(target="remote")
    gl.schedule(job, name="yearly", cron="0 0 1 1 *")
    (kept,) = (server.home / "bundles").iterdir()
    inode = kept.stat().st_ino

    later = gl.launch(job)  # the same folder: asked for by digest, not uploaded again
    end = later.wait(60)
    assert end["state"] == "succeeded", end
    assert "kept for later" in later.logs()
    with server.store() as store:
        assert store.get_job(later.id).bundle_digest == kept.name.removesuffix(".tar.gz")
    assert kept.stat().st_ino == inode  # the same file, never written again
    assert [p.name for p in (server.home / "bundles").iterdir()] == [kept.name]


def _budget_for_one_run(name: str) -> dict[str, Any]:
    """A schedule whose budget fits one run: its job may rent (worst case 36 x 90 / 3600 = 0.9
    of 1.0) and, with no provider here, waits as a remote job, live and counted at worst case."""
    job = {
        "workload": {"kind": "command", "command": ["true"]},
        "placement": {
            "target": "cloud",
            "fallback_targets": ["remote"],
            "on_unschedulable": "queue",
            "max_hourly_cost": 36.0,
            "provisioning": {"provisioning_timeout_seconds": 60},
        },
        "timeout_seconds": 30,
    }
    return {
        "name": name,
        "cron": "0 0 1 1 *",
        "job": job,
        "budget": {"max_cost": 1.0, "period": "day"},
        "concurrency": "allow",
    }


@pytest.mark.slow
@pytest.mark.parametrize(("database", "servers"), [("sqlite", 1), ("sqlite", 2), ("postgresql", 2)])
def test_concurrent_triggers_of_a_budget_that_fits_one_run_start_one(
    tmp_path: Path, database: str, servers: int
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with contextlib.ExitStack() as stack:
        if database == "postgresql":
            if postgres_bin() is None:
                pytest.fail("PostgreSQL is not installed: .ci/run installs it")
            url: str | None = stack.enter_context(postgres_cluster())
        else:
            url = f"sqlite:///{tmp_path / 'shared.db'}"
        planes = []
        for i in range(servers):
            plane = ServerProcess(tmp_path / f"s{i}", database_url=url).start()
            stack.callback(plane.stop)
            planes.append(plane)
        clients = [plane.client() for plane in planes]
        clients[0].request("POST", "/v1/schedules", {"schedule": _budget_for_one_run("b")})

        def trigger(i: int) -> dict[str, Any]:
            reply: dict[str, Any] = clients[i % servers].request("POST", "/v1/schedules/b/trigger")
            return reply

        with ThreadPoolExecutor(12) as pool:
            replies = list(pool.map(trigger, range(12)))
        started = [r["job_id"] for r in replies if r["job_id"]]
        assert len(started) == 1, replies
        assert {r["skipped"] for r in replies if not r["job_id"]} == {"budget_exhausted"}
        assert [j["id"] for j in scheduled_jobs(planes[-1], "b")] == started


def test_schedule_routes_refuse_fields_of_the_wrong_type_with_422(server: ServerProcess) -> None:
    import httpx

    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    good = document("typed", ["true"])
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
        for field, value in [
            ("working_dir", ["a", "b"]),
            ("working_dir", {"a": 1}),
            ("working_dir", 7),
            ("bundle_id", ["x"]),
            ("source_dir", {"x": 1}),
            ("schedule", "a string"),
            ("schedule", None),
        ]:
            reply = http.post("/v1/schedules", json={"schedule": good, field: value})
            assert reply.status_code == 422, (field, value, reply.text)
            assert reply.json()["error"].startswith(field), reply.json()
        assert http.get("/v1/schedules").json() == []
        for query in ["limit=abc", "limit=1e400", "limit=nan"]:
            reply = http.get(f"/v1/schedules/typed/runs?{query}")
            assert reply.status_code in (404, 422), (query, reply.text)
