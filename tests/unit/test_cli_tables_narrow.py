"""Every table people read fits an 80-column terminal without cutting an id, a date or a
word: each is rendered with long, realistic values and every value must appear whole."""

from __future__ import annotations

import re
from collections.abc import Iterable

import pytest

from gpulayer.cli import render, schedule_render

WORKER_ID = "w-q2cxv7hz3k"
JOB_ID = "j-0qdk4m7x2v"
INSTANCE_ID = "i-0123456789abcdef0"
STARTED = "2026-12-01 09:00:00"
FINISHED = "2026-12-01 10:42:17"


@pytest.fixture(autouse=True)
def narrow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")


def _fits(out: str, whole: Iterable[str]) -> str:
    """``out`` with every line at most 80 wide and every value in ``whole`` on one line."""
    lines = out.splitlines()
    assert lines and all(len(line) <= 80 for line in lines), out
    # A date is never parted from its time.
    for line in lines:
        for match in re.finditer(r"\d{4}-\d\d-\d\d", line):
            assert re.match(r" \d\d:\d\d:\d\d", line[match.end() :]), out
    for value in whole:
        assert any(value in line for line in lines), f"{value!r} is cut in:\n{out}"
    return out


def _words_whole(out: str, text: str) -> None:
    """Every word of ``text`` appears whole (a line may hold some of them, never half one)."""
    words_out = set(re.split(r"\s+", out))
    for word in text.split():
        assert word in words_out, f"{word!r} is cut in:\n{out}"


def test_workers(capsys: pytest.CaptureFixture[str]) -> None:
    worker = {
        "id": WORKER_ID,
        "name": "gpu-box-1.lab.example.org",
        "kind": "remote",
        "state": "online",
        "running": 2,
        "labels": {"team": "vision", "rack": "b12"},
        "capabilities": {
            "gpus": [{"name": "NVIDIA A100-SXM4-80GB", "memory_gb": 80}] * 8,
            "accelerator": "cuda",
            "cpu_cores": 96,
            "memory_gb": 1121.4,
            "os": "linux",
            "cpu_arch": "x86_64",
            "python_version": "3.12.7",
            "isolation": "per_job_uid",
        },
    }
    render.workers_table([worker, {**worker, "id": "w-zzzzzzzzzz", "kind": "local"}])
    out = _fits(capsys.readouterr().out, [WORKER_ID, "w-zzzzzzzzzz", "gpu-box-1.lab.example.org"])
    for word in ("ID", "NAME", "KIND", "STATE", "RUNNING", "remote", "local", "online"):
        assert re.search(rf"(^|\s){word}(\s|$)", out, re.M), f"{word!r} is cut in:\n{out}"
    _words_whole(out, "NVIDIA A100-SXM4-80GB")


def test_instances(capsys: pytest.CaptureFixture[str]) -> None:
    item = {
        "instance_id": INSTANCE_ID,
        "request_id": "r-0123456789ab",
        "provider": "aws",
        "instance_type": "p4de.24xlarge",
        "region": "ap-southeast-2",
        "zone": "ap-southeast-2a",
        "state": "provisioning",
        "age_in_state_seconds": 5000,
        "hourly_price": 40.96572,
        "cost": 123.4567,
        "currency": "USD",
        "job_id": JOB_ID,
    }
    render.instances_table([item])
    _fits(
        capsys.readouterr().out,
        [INSTANCE_ID, JOB_ID, "p4de.24xlarge", "ap-southeast-2a", "provisioning"],
    )


def test_status_attempts(capsys: pytest.CaptureFixture[str]) -> None:
    attempt = {
        "number": 1,
        "state": "failed",
        "reason": "worker_lost",
        "worker_name": "gpu-box-1.lab.example.org",
        "worker_id": WORKER_ID,
        "gpu_indices": [0, 1, 2, 3],
        "started_at": "2026-12-01T09:00:00+00:00",
        "finished_at": "2026-12-01T10:42:17+00:00",
    }
    job = {
        "id": JOB_ID,
        "name": "finetune",
        "state": "running",
        "attempts": [attempt, {**attempt, "number": 2, "state": "running", "reason": None}],
    }
    render.job_panel(job)
    out = _fits(capsys.readouterr().out, [JOB_ID, WORKER_ID, STARTED])
    _words_whole(out, "gpu-box-1.lab.example.org worker_lost")


def test_schedule_runs(capsys: pytest.CaptureFixture[str]) -> None:
    note = "skipped: the previous run j-7hz3k9q2cx is still running (concurrency forbid)"
    runs = [
        {
            "tick": "2026-12-01T09:00:00+00:00",
            "manual": True,
            "job_id": None,
            "outcome": "concurrency",
            "job_state": None,
            "cost": None,
            "late_seconds": 0.42,
            "message": note,
        },
        {
            "tick": "2026-12-01T10:00:00+00:00",
            "manual": False,
            "job_id": JOB_ID,
            "outcome": "created",
            "job_state": "succeeded",
            "cost": 0.1234,
            "late_seconds": 1.5,
            "message": "",
        },
    ]
    schedule_render.runs_table(runs)
    out = _fits(capsys.readouterr().out, [JOB_ID, "12-01 09:00:00", "succeeded"])
    _words_whole(out, note)
    note_lines = [line for line in out.splitlines() if "concurrency" in line or "skipped" in line]
    # A note wraps into a few lines, not one word a line.
    assert sum(1 for line in out.splitlines() if line.strip()) <= 8, out
    assert note_lines


def test_token_ls_all(capsys: pytest.CaptureFixture[str]) -> None:
    tokens = [
        {
            "id": "t-0a1b2c3d4e",
            "kind": "join",
            "name": "gpu-lab-rack-b12-join-token",
            "state": "active",
            "registered": 3,
            "max_workers": 10,
            "expires_at": "2027-01-01T00:00:00+00:00",
            "created_at": "2026-12-01T09:00:00+00:00",
        },
        {
            "id": "t-9f8e7d6c5b",
            "kind": "api",
            "name": "ci",
            "state": "revoked",
            "registered": 0,
            "max_workers": None,
            "expires_at": None,
            "created_at": "2026-11-02T12:30:45+00:00",
        },
    ]
    render.token_table(tokens)
    _fits(
        capsys.readouterr().out,
        [
            "t-0a1b2c3d4e",
            "t-9f8e7d6c5b",
            "gpu-lab-rack-b12-join-token",
            "2027-01-01 00:00:00",
            "revoked",
        ],
    )
