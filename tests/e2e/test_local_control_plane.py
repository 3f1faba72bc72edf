"""The on-demand local control plane: status, stop, restart, and restarts by itself when its
code, plugins or environment changed, never mid-job. Real daemons, real CLI processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import run_cli
from tests.support.daemon import pid_alive

pytestmark = pytest.mark.slow  # each test starts and stops daemons


def _status(env: dict[str, str] | None = None) -> dict[str, Any]:
    result = run_cli(["server", "status", "--json"], env=env)
    data: dict[str, Any] = json.loads(result.stdout)
    # As `systemctl status` does for a stopped unit: 3 when nothing runs.
    assert result.returncode == (0 if data["running"] else 3), result.stderr
    return data


def _job(job_id: str) -> dict[str, Any]:
    result = run_cli(["status", job_id, "--json"])
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def _wait_for(predicate: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _gated_job(tmp_path: Path) -> tuple[str, Path]:
    """A detached job that runs until the returned file exists."""
    gate = tmp_path / "gate"
    script = (
        "import os, time\n"
        f"while not os.path.exists({str(gate)!r}):\n"
        "    time.sleep(0.05)\n"
        "print('released')\n"
    )
    submitted = run_cli(["submit", "-d", "--", "python", "-c", script], cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    _wait_for(lambda: _job(job_id)["state"] == "running", f"{job_id} to run")
    return job_id, gate


def _plugin_dir(tmp_path: Path, name: str = "tiny") -> Path:
    """A plugin distribution on a folder that PYTHONPATH can add: one module and its
    dist-info with a gpulayer.providers entry point, as pip would leave them."""
    root = tmp_path / f"plugin-{name}"
    info = root / f"gpulayer_{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: gpulayer-{name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[gpulayer.providers]\n{name} = gpulayer_{name}:Provider\n"
    )
    (root / f"gpulayer_{name}.py").write_text("class Provider:\n    pass\n")
    return root


def _with_path(extra: Path) -> dict[str, str]:
    current = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": f"{extra}{os.pathsep}{current}" if current else str(extra)}


def test_status_of_a_home_where_nothing_runs_exits_3_in_one_line(tmp_path: Path) -> None:
    home = tmp_path / "empty-home"
    result = run_cli(["server", "status"], env={"GPULAYER_HOME": str(home)})
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert result.stdout.splitlines() == [f"local control plane: not running (home {home})"]
    as_json = run_cli(["server", "status", "--json"], env={"GPULAYER_HOME": str(home)})
    assert as_json.returncode == 3 and json.loads(as_json.stdout)["running"] is False
    assert not (home / "server.json").exists()  # asking started nothing


def test_status_stop_and_restart() -> None:
    run_cli(["server", "stop"])
    assert _status()["running"] is False
    stopped = run_cli(["server", "status"])
    assert stopped.returncode == 3 and "not running" in stopped.stdout
    ran = run_cli(["submit", "--", "python", "-c", "print('up')"])
    assert ran.returncode == 0, ran.stderr
    first = _status()
    assert first["running"] is True and pid_alive(first["pid"])
    assert first["live_jobs"] == [] and first["in_flight"] == [] and first["version"]
    text = run_cli(["server", "status"]).stdout
    assert f"pid {first['pid']}" in text and "live jobs: 0" in text

    restarted = run_cli(["server", "restart"])
    assert restarted.returncode == 0, restarted.stderr
    second = _status()
    assert second["running"] and second["pid"] != first["pid"]
    assert not pid_alive(first["pid"])

    stopped = run_cli(["server", "stop"])
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert not pid_alive(second["pid"]) and _status()["running"] is False


def test_stop_waits_for_live_jobs(tmp_path: Path) -> None:
    job_id, gate = _gated_job(tmp_path)
    pid = _status()["pid"]
    stopper = subprocess.Popen(
        [sys.executable, "-m", "gpulayer", "server", "stop"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # While the job runs, stop keeps waiting and the daemon keeps serving.
        with pytest.raises(subprocess.TimeoutExpired):
            stopper.wait(timeout=3)
        assert pid_alive(pid) and _job(job_id)["state"] == "running"
        assert _status()["live_jobs"] == [job_id]
        gate.write_text("go")
        out, err = stopper.communicate(timeout=60)
    finally:
        if stopper.poll() is None:
            stopper.kill()
    assert stopper.returncode == 0, err
    assert "stopped" in out
    # Not a terminal: the wait is said in one plain line, not left silent.
    assert err.count(f"waiting for 1 live job to end ({job_id}") == 1, err
    assert not pid_alive(pid)
    job = _job(job_id)
    assert job["state"] == "succeeded", job


def test_stop_force_cancels_live_jobs(tmp_path: Path) -> None:
    job_id, _gate = _gated_job(tmp_path)
    pid = _status()["pid"]
    stopped = run_cli(["server", "stop", "--force"])
    assert stopped.returncode == 0, stopped.stderr
    assert not pid_alive(pid)
    job = _job(job_id)
    assert job["state"] == "cancelled" and job["reason"] == "cancelled", job


def test_a_new_plugin_restarts_it_when_idle(tmp_path: Path) -> None:
    run_cli(["submit", "--", "true"])
    before = _status()
    assert "tiny" not in before["plugins"]
    env = _with_path(_plugin_dir(tmp_path))
    listed = run_cli(["ls"], env=env)
    assert listed.returncode == 0, listed.stderr
    assert "restarted the local control plane (the installed plugins changed (+tiny))" in (
        listed.stderr
    )
    after = _status(env)
    assert after["pid"] != before["pid"] and not pid_alive(before["pid"])
    assert "tiny" in after["plugins"]
    # Unchanged since, it is left alone.
    again = run_cli(["ls"], env=env)
    assert again.stderr == "" and _status(env)["pid"] == after["pid"]


def test_never_mid_job_and_says_so_once(tmp_path: Path) -> None:
    run_cli(["submit", "--", "true"])
    job_id, gate = _gated_job(tmp_path)
    pid = _status()["pid"]
    env = _with_path(_plugin_dir(tmp_path, "late"))
    first = run_cli(["ls"], env=env)
    assert first.returncode == 0, first.stderr
    assert "runs other code (the installed plugins changed (+late))" in first.stderr
    assert "1 live job end" in first.stderr
    second = run_cli(["ls"], env=env)
    assert "runs other code" not in second.stderr
    assert _status(env)["pid"] == pid and _job(job_id)["state"] == "running"
    assert _status(env)["restart_wanted"] == ["the installed plugins changed (+late)"]

    gate.write_text("go")
    _wait_for(lambda: _job(job_id)["state"] == "succeeded", f"{job_id} to end")
    after = run_cli(["ls"], env=env)
    assert "restarted the local control plane" in after.stderr
    assert _status(env)["pid"] != pid and "late" in _status(env)["plugins"]


def test_settings_read_at_start_are_refused_mid_job(tmp_path: Path) -> None:
    run_cli(["submit", "--", "true"])
    job_id, gate = _gated_job(tmp_path)
    pid = _status()["pid"]
    changed = run_cli(["ls"], env={"GPULAYER_IDLE_SECONDS": "45"})
    assert changed.returncode == 0
    assert (
        "gpulayer: GPULAYER_IDLE_SECONDS=45 is not applied: the local control plane must "
        "restart for it and has 1 live job"
    ) in changed.stderr
    assert _status({"GPULAYER_IDLE_SECONDS": "45"})["pid"] == pid
    gate.write_text("go")
    _wait_for(lambda: _job(job_id)["state"] == "succeeded", f"{job_id} to end")
    applied = run_cli(["ls"], env={"GPULAYER_IDLE_SECONDS": "45"})
    assert "GPULAYER_IDLE_SECONDS changed" in applied.stderr
    now = _status({"GPULAYER_IDLE_SECONDS": "45"})
    assert now["pid"] != pid and now["idle_seconds"] == 45
    run_cli(["server", "stop"], env={"GPULAYER_IDLE_SECONDS": "45"})


def test_settings_read_per_job_apply_to_the_next_job(tmp_path: Path) -> None:
    run_cli(["submit", "--", "true"])
    pid = _status()["pid"]
    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text("gpulayer:\n  ssh_cidr: nonsense\n")
    env = {"GPULAYER_PROVIDERS_FILE": str(elsewhere)}
    refused = run_cli(["submit", "--target", "cloud", "--", "true"], env=env, cwd=tmp_path)
    # The running control plane read the file this shell names, without a restart.
    assert refused.returncode == 2, refused.stderr
    assert f"{elsewhere}: gpulayer.ssh_cidr: 'nonsense' is not a CIDR" in refused.stderr
    status = _status(env)
    assert status["pid"] == pid and status["env"]["GPULAYER_PROVIDERS_FILE"] == str(elsewhere)
    # Unset again in the next shell: the control plane forgets it too.
    plain = run_cli(["submit", "--target", "cloud", "--fallback", "local", "--", "true"])
    assert "nonsense" not in plain.stderr
    assert "GPULAYER_PROVIDERS_FILE" not in _status()["env"]
