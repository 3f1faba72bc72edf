"""`gpulayer schedule ...` through the real command line and the on-demand local control plane,
and `gl.schedule` / `fn.schedule` through the SDK."""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e_cloud.journey import wait_until
from tests.support.cli import run_cli
from tests.support.daemon import pid_alive, stop_local_control_plane


def cli_json(args: list[str]) -> Any:
    at = args.index("--") if "--" in args else len(args)  # flags go before the job's argv
    result = run_cli([*args[:at], "--json", *args[at:]])
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def runs_of(name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = cli_json(["schedule", "runs", name])
    return found


def daemon_pid(home: Path) -> int:
    return int(json.loads((home / "server.json").read_text())["pid"])


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--cron", "0 4 * * *", "--timezone", "Europe/Berln"],
            "error: timezone: unknown zone 'Europe/Berln'",
        ),
        (["--cron", "0 4 * *"], "error: cron: '0 4 * *' has 4 fields"),
        (["--cron", "0 4 * * *", "--concurrency", "sometimes"], "error: concurrency: 'sometimes'"),
        (["--cron", "0 4 * * *", "--budget", "5", "--target", "cloud"], "error: job.placement."),
        (["--cron", "0 4 * * *", "--budget-period", "day"], "error: --budget: required"),
        (
            ["--cron", "0 4 * * *", "--accelerator", "cpu", "--gpus", "2"],
            "error: --gpus: a cpu job cannot ask for GPUs",
        ),
    ],
)
def test_bad_input_names_the_field_exits_2_and_creates_nothing(
    args: list[str], line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "fresh-home"
    monkeypatch.setenv("GPULAYER_HOME", str(home))
    result = run_cli(["schedule", "create", "bad", *args, "--", "true"])
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(line), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr
    assert not (home / "server.json").exists()  # not even a control plane was started


def test_bad_file_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        yaml.safe_dump(
            {"name": "f", "cron": "0 4 * * *", "job": {"workload": {"kind": "cmd"}}, "x": 1}
        )
    )
    result = run_cli(["schedule", "apply", "-f", str(path)])
    assert result.returncode == 2
    assert "error: x: unknown field" in result.stderr
    assert "error: job.workload: unknown kind" in result.stderr


def test_create_runs_pause_trigger_resume_delete(shared_home: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    marker.mkdir()
    script = (
        "import os, pathlib; "
        f"pathlib.Path({str(marker)!r}, os.environ['GPULAYER_JOB_ID']).write_text('x')"
    )
    created = cli_json(
        [
            "schedule",
            "create",
            "cli-every2",
            "--cron",
            "*/2 * * * * *",
            "--label",
            "team=eval",
            "--",
            sys.executable,
            "-c",
            script,
        ]
    )
    assert created["created"] is True
    view = created["schedule"]
    assert view["state"] == "active" and len(view["next_ticks"]) == 5
    first = wait_until(
        lambda: [r for r in runs_of("cli-every2") if r["outcome"] == "created"], what="a run"
    )
    job = cli_json(["status", first[0]["job_id"]])
    assert job["labels"]["team"] == "eval"
    assert job["labels"]["gpulayer.dev/schedule"] == "cli-every2"

    listing = run_cli(["schedule", "ls"])
    assert listing.returncode == 0
    assert "cli-every2" in listing.stdout and "active" in listing.stdout
    assert "stays up while 1 schedule(s) are active" in listing.stderr
    assert [s["name"] for s in cli_json(["schedule", "ls"])] == ["cli-every2"]

    paused = cli_json(["schedule", "pause", "cli-every2"])
    assert paused["state"] == "paused"
    paused_at = time.time()
    wait_until(
        lambda: any(r["outcome"] == "suspended" for r in runs_of("cli-every2")),
        what="a suspended tick",
    )
    triggered = run_cli(["schedule", "trigger", "cli-every2"])
    assert triggered.returncode == 0, triggered.stderr
    job_id = triggered.stdout.strip()
    wait_until(lambda: (marker / job_id).exists(), what="the triggered run")
    resumed_at = time.time()
    assert cli_json(["schedule", "resume", "cli-every2"])["state"] == "active"
    wait_until(
        lambda: any(
            r["outcome"] == "created" and datetime.fromisoformat(r["tick"]).timestamp() > resumed_at
            for r in runs_of("cli-every2")
        ),
        what="a run after resume",
    )
    runs = runs_of("cli-every2")
    while_paused = [
        r
        for r in runs
        if paused_at < datetime.fromisoformat(r["tick"]).timestamp() < resumed_at
    ]
    assert [r["job_id"] for r in while_paused if r["outcome"] == "created"] == [job_id], runs
    assert [r["manual"] for r in while_paused if r["outcome"] == "created"] == [True]
    ticks = [r["tick"] for r in runs]
    assert len(ticks) == len(set(ticks))

    shown = cli_json(["schedule", "show", "cli-every2"])
    assert len(shown["next_ticks"]) == 5 and shown["runs"]
    text = run_cli(["schedule", "show", "cli-every2"]).stdout
    assert "next ticks" in text and "last runs" in text

    assert cli_json(["schedule", "delete", "cli-every2"])["deleted"] is True
    missing = run_cli(["schedule", "show", "cli-every2"])
    assert missing.returncode == 2 and "no schedule named 'cli-every2'" in missing.stderr


def test_apply_updates_by_name_and_reads_yaml(shared_home: Path, tmp_path: Path) -> None:
    path = tmp_path / "nightly.yaml"
    document = {
        "name": "nightly-eval",
        "cron": "0 4 * * *",
        "timezone": "Europe/Berlin",
        "job": {"workload": {"kind": "command", "command": ["true"]}},
        "concurrency": "forbid",
    }
    path.write_text(yaml.safe_dump(document))
    assert cli_json(["schedule", "apply", "-f", str(path)])["created"] is True
    document["cron"] = ["0 4 * * *", "30 12 * * 1-5"]
    path.write_text(yaml.safe_dump(document))
    again = cli_json(["schedule", "apply", "-f", str(path)])
    assert again["created"] is False
    assert again["schedule"]["cron"] == ["0 4 * * *", "30 12 * * 1-5"]
    offsets = {t[-6:] for t in again["schedule"]["next_ticks"]}
    assert offsets <= {"+01:00", "+02:00"}  # shown in the schedule's zone
    run_cli(["schedule", "delete", "nightly-eval"])


def test_an_active_schedule_keeps_the_local_control_plane_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "idle-home"
    monkeypatch.setenv("GPULAYER_HOME", str(home))
    monkeypatch.setenv("GPULAYER_IDLE_SECONDS", "1")
    try:
        cli_json(["schedule", "create", "daily", "--cron", "0 4 * * *", "--", "true"])
        pid = daemon_pid(home)
        time.sleep(4)  # several idle passes of the watchdog, each past the 1 s idle limit
        assert pid_alive(pid), "the local control plane exited with an active schedule"
        note = run_cli(["schedule", "ls"]).stderr
        assert f"the local control plane (pid {pid}) stays up" in note
        cli_json(["schedule", "pause", "daily"])
        wait_until(lambda: not pid_alive(pid), 20, "the idle control plane to exit")
    finally:
        stop_local_control_plane(home)


def test_sdk_schedule_and_remote_function_schedule(shared_home: Path) -> None:
    import gpulayer as gl
    from gpulayer.errors import SpecError
    from tests.support import scheduled_functions

    handle = gl.schedule(
        gl.command(["true"]),
        name="sdk-nightly",
        cron=gl.Cron("0 4 * * *", timezone="America/New_York"),
        concurrency="replace",
    )
    ticks = handle.next_ticks(3)
    assert len(ticks) == 3 and all(t.hour == 4 for t in ticks)
    assert all(str(t.tzinfo) == "America/New_York" for t in ticks)
    job = handle.trigger()
    assert job.wait(timeout=60)["state"] == "succeeded"
    assert [r["job_id"] for r in handle.runs()] == [job.id]
    handle.pause()
    assert handle.status()["state"] == "paused"
    handle.resume()
    handle.delete()

    with pytest.raises(SpecError, match="timezone: unknown zone 'Mars/Base'"):
        gl.schedule(gl.command(["true"]), name="x", cron="0 4 * * *", timezone="Mars/Base")

    fn_handle = scheduled_functions.add.schedule("0 5 * * *", 2, 3, name="sdk-add")
    fn_job = fn_handle.trigger()
    assert fn_job.result(timeout=60) == 5
    assert fn_handle.status()["spec"]["job"]["workload"]["kind"] == "function"
    fn_handle.delete()


def test_schema_schedule_prints_the_schedule_json_schema() -> None:
    result = run_cli(["schema", "--schedule"])
    assert result.returncode == 0, result.stderr
    schema = json.loads(result.stdout)
    assert schema["title"] == "Schedule"
    assert {"name", "cron", "job"} <= set(schema["required"])
    assert schema["properties"]["concurrency"]["enum"] == ["allow", "forbid", "replace"]
    job = json.loads(run_cli(["schema"]).stdout)
    assert job["title"] == "JobSpec"
