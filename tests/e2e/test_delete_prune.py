"""`gpulayer delete` and `gpulayer prune` through the real command line and local control plane:
finished jobs go with their logs, outputs, bundle and rows; a live job is never touched."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from gpulayer.cli.cleanup_commands import parse_age
from gpulayer.errors import UsageError
from tests.support.cli import run_cli

DAY = 86400.0


def submit(tmp_path: Path, *argv: str, detach: bool = False) -> str:
    args = ["submit", *(["-d"] if detach else []), "--", *argv]
    result = run_cli(args, cwd=tmp_path)
    if detach:
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()
    assert result.returncode == 0, result.stderr
    listed = json.loads(run_cli(["ls", "--json", "-n", "1"]).stdout)
    return str(listed[0]["id"])


def status(job_id: str) -> dict[str, Any]:
    result = run_cli(["status", job_id, "--json"])
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def wait_for_state(job_id: str, state: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if status(job_id)["state"] == state:
            return
        time.sleep(0.2)
    raise AssertionError(f"{job_id} never became {state}")


def rows_of(home: Path, job_id: str) -> dict[str, int]:
    with sqlite3.connect(home / "state.db", timeout=30) as db:
        return {
            table: db.execute(
                f"SELECT count(*) FROM {table} WHERE {key} = ?", (job_id,)
            ).fetchone()[0]
            for table, key in (
                ("jobs", "id"),
                ("logs", "job_id"),
                ("attempts", "job_id"),
                ("artifacts", "job_id"),
            )
        }


def finished_job_with_outputs(tmp_path: Path) -> str:
    script = (
        "import os; print('hello'); "
        "open(os.path.join(os.environ['GPULAYER_OUTPUT_DIR'], 'model.bin'), 'w').write('w')"
    )
    return submit(tmp_path, "python", "-c", script)


def test_delete_removes_finished_jobs_and_refuses_live_ones(
    tmp_path: Path, shared_home: Path
) -> None:
    done = finished_job_with_outputs(tmp_path)
    live = submit(tmp_path, "sleep", "120", detach=True)
    wait_for_state(live, "running")
    before = rows_of(shared_home, done)
    assert before["jobs"] == before["attempts"] == before["artifacts"] == 1
    assert before["logs"] >= 1
    assert (shared_home / "jobs" / done / "outputs" / "model.bin").exists()

    refused = run_cli(["delete", done, live])
    assert refused.returncode == 2
    assert live in refused.stderr and "running" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert rows_of(shared_home, done)["jobs"] == 1  # all or nothing
    assert status(live)["state"] == "running"

    dry = run_cli(["delete", done, "--dry-run", "--json"])
    assert dry.returncode == 0, dry.stderr
    assert [j["id"] for j in json.loads(dry.stdout)] == [done]
    assert rows_of(shared_home, done)["jobs"] == 1

    deleted = run_cli(["delete", done, "--json"])
    assert deleted.returncode == 0, deleted.stderr
    assert [j["id"] for j in json.loads(deleted.stdout)] == [done]
    assert rows_of(shared_home, done) == {"jobs": 0, "logs": 0, "attempts": 0, "artifacts": 0}
    assert not (shared_home / "jobs" / done).exists()
    gone = run_cli(["status", done])
    assert gone.returncode == 2 and "not found" in gone.stderr

    assert status(live)["state"] == "running"
    assert run_cli(["cancel", live]).returncode == 0
    wait_for_state(live, "cancelled")


def test_prune_removes_only_finished_jobs_past_the_age(tmp_path: Path, shared_home: Path) -> None:
    old = finished_job_with_outputs(tmp_path)
    recent = finished_job_with_outputs(tmp_path)
    live = submit(tmp_path, "sleep", "120", detach=True)
    wait_for_state(live, "running")
    with sqlite3.connect(shared_home / "state.db", timeout=30) as db:
        # Made long ago: the live one too, which must stay whatever its age.
        db.execute(
            "UPDATE jobs SET created_at = created_at - ?, finished_at = finished_at - ? "
            "WHERE id IN (?, ?)",
            (40 * DAY, 40 * DAY, old, live),
        )

    dry = run_cli(["prune", "--older-than", "30d", "--dry-run", "--json"])
    assert dry.returncode == 0, dry.stderr
    assert [j["id"] for j in json.loads(dry.stdout)] == [old]
    assert rows_of(shared_home, old)["jobs"] == 1

    pruned = run_cli(["prune", "--older-than", "30d"])
    assert pruned.returncode == 0, pruned.stderr
    assert f"deleted {old}" in pruned.stdout
    assert rows_of(shared_home, old)["jobs"] == 0
    assert not (shared_home / "jobs" / old).exists()
    assert rows_of(shared_home, recent)["jobs"] == 1
    assert (shared_home / "jobs" / recent / "outputs" / "model.bin").exists()
    assert status(live)["state"] == "running"
    run_cli(["cancel", live])
    wait_for_state(live, "cancelled")


def test_prune_age_must_be_an_age() -> None:
    bad = run_cli(["prune", "--older-than", "soon"])
    assert bad.returncode == 2
    assert bad.stderr.strip().startswith("error: --older-than:")
    assert len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30d", 30 * DAY),
        ("12h", 43200),
        ("1w2d", 9 * DAY),
        ("90m", 5400),
        ("45", 45),
        ("1.5h", 5400),
    ],
)
def test_parse_age(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds


@pytest.mark.parametrize("text", ["", "d", "30x", "-1d", "30d junk", "1d-2h"])
def test_parse_age_refuses(text: str) -> None:
    with pytest.raises(UsageError, match="--older-than"):
        parse_age(text)
