"""JobRun with function workloads: the shim imports module:function from the source, calls
it in a process of its own and hands back its JSON return value."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from gpulayer.protocol.bundle import create_bundle
from gpulayer.spec import JobSpec
from gpulayer.worker.runner import JobRun, RunContext, RunOutcome

MODULE = """
import asyncio
import os
import sys

def combine(a, b, *, scale=1, tags=()):
    return {"sum": (a + b) * scale, "tags": list(tags), "nested": [None, True, 1.5, "x"]}

async def later(x):
    await asyncio.sleep(0)
    return x * 2

def explode(n):
    helper_that_raises(n)

def helper_that_raises(n):
    raise ValueError(f"bad input {n}\\nsecond line")

def not_json():
    return {1, 2, 3}

def not_finite():
    return float("nan")

def killed():
    os.kill(os.getpid(), 9)

def leaves():
    sys.exit(4)

def chatty():
    print("to stdout")
    print("to stderr", file=sys.stderr)
    return os.getcwd()

def leak_secret():
    raise RuntimeError("auth failed for " + os.environ["TOKEN"])

class Model:
    @staticmethod
    def predict(x):
        return [x, x]
"""


class Logs:
    def __init__(self) -> None:
        self.chunks: list[tuple[str, str]] = []

    def __call__(self, stream: str, text: str) -> None:
        self.chunks.append((stream, text))

    def text(self, stream: str) -> str:
        return "".join(t for s, t in self.chunks if s == stream)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "jobs.py").write_text(textwrap.dedent(MODULE))
    return src


def run_function(
    source: Path,
    entrypoint: str,
    logs: Logs | None = None,
    *,
    args: list[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    **ctx: Any,
) -> RunOutcome:
    workload: dict[str, Any] = {"kind": "function", "entrypoint": entrypoint}
    workload.update({"args": args or [], "kwargs": kwargs or {}})
    fields = ctx.pop("fields", {})
    spec = JobSpec.model_validate({"workload": workload, **fields})
    if "bundle" not in ctx:
        ctx["source_dir"] = source
    context = RunContext("job-1", 1, spec, source.parent / "attempt", **ctx)
    return JobRun(context, logs if logs is not None else Logs()).run()


def test_result_round_trip_with_args_and_kwargs(source: Path) -> None:
    outcome = run_function(
        source, "jobs:combine", args=[2, 3], kwargs={"scale": 10, "tags": ["a", "b"]}
    )
    assert (outcome.state, outcome.reason, outcome.exit_code) == ("succeeded", None, 0)
    assert outcome.result == {"sum": 50, "tags": ["a", "b"], "nested": [None, True, 1.5, "x"]}


def test_async_function_is_awaited(source: Path) -> None:
    outcome = run_function(source, "jobs:later", args=[21])
    assert (outcome.state, outcome.result) == ("succeeded", 42)


def test_dotted_attribute_entrypoint(source: Path) -> None:
    outcome = run_function(source, "jobs:Model.predict", args=["x"])
    assert (outcome.state, outcome.result) == ("succeeded", ["x", "x"])


def test_output_streams_and_cwd_is_the_source(source: Path) -> None:
    logs = Logs()
    outcome = run_function(source, "jobs:chatty", logs)
    assert (outcome.state, outcome.result) == ("succeeded", str(source))
    assert logs.text("stdout") == "to stdout\n"
    assert logs.text("stderr") == "to stderr\n"


def test_exception_gives_function_error_and_a_traceback_in_the_logs(source: Path) -> None:
    logs = Logs()
    outcome = run_function(source, "jobs:explode", logs, args=[42])
    assert (outcome.state, outcome.reason, outcome.exit_code) == ("failed", "function_error", 1)
    assert outcome.message == "ValueError: bad input 42"
    stderr = logs.text("stderr")
    assert stderr.startswith("Traceback (most recent call last):\n")
    assert "jobs.py" in stderr and "in helper_that_raises" in stderr
    assert stderr.rstrip().endswith("ValueError: bad input 42\nsecond line")
    assert "function_shim.py" not in stderr  # the job's author sees their own frames


@pytest.mark.parametrize("entrypoint", ["jobs:not_json", "jobs:not_finite"])
def test_result_that_is_not_json_fails_clearly(source: Path, entrypoint: str) -> None:
    logs = Logs()
    outcome = run_function(source, entrypoint, logs)
    assert (outcome.state, outcome.reason) == ("failed", "function_error")
    message = outcome.message or ""
    assert message.startswith("the return value is not JSON-serializable: ")
    assert message in logs.text("stderr")


def test_sys_exit_in_the_function_is_a_function_error(source: Path) -> None:
    outcome = run_function(source, "jobs:leaves")
    assert (outcome.state, outcome.reason, outcome.exit_code) == ("failed", "function_error", 4)
    assert outcome.message == "the function called sys.exit(4) instead of returning"


def test_process_killed_without_a_result(source: Path) -> None:
    outcome = run_function(source, "jobs:killed")
    assert (outcome.state, outcome.reason, outcome.exit_code) == ("failed", "exit_code", -9)
    assert outcome.message == "the function's process ended without a result (killed by SIGKILL)"


def test_missing_module_is_a_function_error(source: Path) -> None:
    logs = Logs()
    outcome = run_function(source, "no_such_module:f", logs)
    assert (outcome.state, outcome.reason) == ("failed", "function_error")
    assert outcome.message == "ModuleNotFoundError: No module named 'no_such_module'"
    assert "ModuleNotFoundError" in logs.text("stderr")


def test_missing_function_is_a_function_error(source: Path) -> None:
    outcome = run_function(source, "jobs:nope")
    assert (outcome.state, outcome.reason) == ("failed", "function_error")
    assert "AttributeError" in (outcome.message or "") and "nope" in (outcome.message or "")


def test_source_modules_win_over_the_shims_neighbours(tmp_path: Path) -> None:
    # The shim lives next to process.py and runner.py; a job's own process.py must be the one
    # imported.
    src = tmp_path / "src"
    src.mkdir()
    (src / "process.py").write_text("def main():\n    return 'the job process module'\n")
    outcome = run_function(src, "process:main")
    assert (outcome.state, outcome.result) == ("succeeded", "the job process module")


def test_function_from_a_bundle(tmp_path: Path, source: Path) -> None:
    bundle = create_bundle(source, tmp_path / "src.tar.gz").path
    (source / "jobs.py").unlink()
    outcome = run_function(source, "jobs:combine", args=[1, 1], bundle=bundle)
    assert outcome.state == "succeeded"
    assert isinstance(outcome.result, dict) and outcome.result["sum"] == 2


def test_secret_in_an_exception_is_masked(source: Path) -> None:
    secret = "tok-9d8e7f6a5b"
    logs = Logs()
    outcome = run_function(
        source,
        "jobs:leak_secret",
        logs,
        fields={"secrets": [{"name": "TOKEN"}]},
        worker_env={"TOKEN": secret},
    )
    assert outcome.message == "RuntimeError: auth failed for ***"
    assert secret not in logs.text("stderr") + logs.text("stdout") + logs.text("system")
    assert "auth failed for ***" in logs.text("stderr")
