"""The fast `gpulayer submit` path reads every flag as the typer command does, leaves to typer
what it cannot read the same way, and job arrays expand as `--array` says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpulayer.cli import fast_submit, job_arrays
from gpulayer.errors import UsageError

CASES = [
    ["submit", "--", "python", "train.py", "--epochs", "3"],
    ["submit", "-d", "--name", "nightly", "--", "python", "etl.py"],
    ["submit", "--env", "A=1", "--env=B=2", "--secret", "HF_TOKEN", "-d", "--", "true"],
    ["submit", "--gpus", "2", "--timeout", "30.5", "--max-hourly-cost=4", "--", "x"],
    ["submit", "--target", "remote", "--fallback", "cloud", "--fallback", "local", "--", "x"],
    ["submit", "--worker-label", "pool=a", "--label", "team=b", "--input", "a:b", "--", "x"],
    ["submit", "--provider", "aws", "--region", "us-east-1", "--gpu", "H100", "--", "x"],
    ["submit", "--profile", "pytorch-cuda", "--accelerator", "cuda", "--", "x", "-d"],
    ["submit", "-f", "job.yaml", "--server", "http://h:1", "--array", "0-9%2"],
    ["submit", "--detach", "--array=1,3,5", "--", "echo", "--name"],
]


def _typer_reading(args: list[str], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    from gpulayer.cli import submit_run
    from gpulayer.cli.app import app

    seen: dict[str, Any] = {}

    def record(**kwargs: Any) -> int:
        seen.update(kwargs)
        return 0

    monkeypatch.setattr(submit_run, "run_submit", record)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return seen


@pytest.mark.parametrize("args", CASES)
def test_the_fast_path_reads_flags_as_typer_does(
    args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = _typer_reading(args, monkeypatch)
    found = fast_submit.parse(args)
    assert found is not None
    seen: dict[str, Any] = {}

    def record(**kwargs: Any) -> int:
        seen.update(kwargs)
        return 0

    monkeypatch.setattr("gpulayer.cli.submit_run.run_submit", record)
    assert fast_submit.run(found) == 0
    assert seen == expected


@pytest.mark.parametrize(
    "args",
    [
        ["submit", "--help"],
        ["submit", "--nope", "1", "--", "x"],
        ["submit", "python", "train.py"],  # no `--`: typer's reading
        ["submit", "--name"],
        ["submit", "--name", "-x", "--", "y"],
        ["submit", "--dry-run", "--", "x"],  # a plan, not a submit
        ["submit", "-d", "--dry-run", "--json", "--", "x"],
        ["plan", "--", "x"],
        ["ls"],
        [],
    ],
)
def test_what_it_cannot_read_the_same_way_goes_to_typer(args: list[str]) -> None:
    assert fast_submit.parse(args) is None


def test_a_value_typer_would_refuse_goes_to_typer() -> None:
    found = fast_submit.parse(["submit", "--gpus", "two", "--", "x"])
    assert found is not None and fast_submit.run(found) is None


def test_a_submit_imports_neither_typer_nor_pydantic(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "sys.argv = ['gpulayer', 'submit', '-d', '--server', 'http://127.0.0.1:9', '--', 'true']\n"
        "from gpulayer.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('typer', 'pydantic', 'rich') if m in sys.modules))\n"
    )
    env = {"GPULAYER_HOME": str(tmp_path), "GPULAYER_TOKEN": "x", "PATH": "/usr/bin:/bin"}
    env["PYTHONPATH"] = ":".join(sys.path)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stderr
    assert "error: " in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("text", "indices", "limit"),
    [
        ("0-3", (0, 1, 2, 3), None),
        ("0-99%10", tuple(range(100)), 10),
        ("1,3,5-6", (1, 3, 5, 6), None),
        ("7", (7,), None),
    ],
)
def test_array_ranges(text: str, indices: tuple[int, ...], limit: int | None) -> None:
    tasks = job_arrays.parse_array(text)
    assert tasks.indices == indices and tasks.limit == limit


@pytest.mark.parametrize("text", ["", "a-b", "5-1", "0-3%0", "0-3%x", "1,1", "0-20000"])
def test_bad_arrays_name_the_flag(text: str) -> None:
    with pytest.raises(UsageError) as refused:
        job_arrays.parse_array(text)
    assert str(refused.value).startswith("--array: ")


def test_each_task_sees_its_index_and_carries_the_array() -> None:
    from gpulayer.control.arrays import array_members

    data = {"workload": {"kind": "command", "command": ["x"]}, "env": {"A": "1"}}
    tasks = job_arrays.parse_array("2-4%2")
    assert job_arrays.array_request(data, tasks) == {
        "spec": data,
        "array": {"indices": [2, 3, 4], "limit": 2},
    }
    jobs = array_members(data, tasks.indices, tasks.limit, "a-0123456789")
    assert [j["labels"]["gpulayer.array.index"] for j in jobs] == ["2", "3", "4"]
    assert jobs[0]["labels"] == {
        "gpulayer.array": "a-0123456789",
        "gpulayer.array.index": "2",
        "gpulayer.array.limit": "2",
        "gpulayer.array.size": "3",
    }
    assert data == {"workload": {"kind": "command", "command": ["x"]}, "env": {"A": "1"}}
