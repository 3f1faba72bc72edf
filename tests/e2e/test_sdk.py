"""The Python SDK against the real local control plane: builders, launch, Job, @remote."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import gpulayer as gl
from gpulayer.errors import SpecError, UsageError


def test_command_builder_runs_and_reports(tmp_path: Path) -> None:
    builder = (
        gl.command(["python", "-c", "import os; print('mode', os.environ['MODE'])"])
        .env(MODE="sdk")
        .name("sdk-cmd")
    )
    spec = builder.spec()
    assert spec.name == "sdk-cmd" and spec.env == {"MODE": "sdk"}
    job = gl.launch(builder)
    status = job.wait(timeout=60)
    assert status["state"] == "succeeded" and status["name"] == "sdk-cmd"
    assert job.result() is None
    assert "mode sdk" in job.logs()


def test_function_builder_returns_the_json_result(tmp_path: Path) -> None:
    (tmp_path / "calc.py").write_text(
        "def mul(a, b=1):\n    return {'product': a * b, 'items': [a, b]}\n"
    )
    job = gl.launch(gl.function("calc:mul", 6, b=7).source(str(tmp_path)))
    assert job.result(timeout=60) == {"product": 42, "items": [6, 7]}
    assert job.status()["result"] == {"product": 42, "items": [6, 7]}


def test_failed_job_raises_jobfailed_with_reason() -> None:
    job = gl.launch(gl.command(["python", "-c", "raise SystemExit(4)"]))
    with pytest.raises(gl.JobFailed) as caught:
        job.result(timeout=60)
    assert caught.value.reason == "exit_code"
    assert caught.value.job_exit_code == 4
    assert caught.value.job_id == job.id


def test_wait_times_out_and_cancel_ends_the_job() -> None:
    job = gl.launch(gl.command(["sleep", "60"]), timeout=120)
    with pytest.raises(gl.JobTimeout):
        job.wait(timeout=0.5)
    job.cancel()
    with pytest.raises(gl.JobFailed) as caught:
        job.result(timeout=30)
    assert caught.value.reason == "cancelled" and caught.value.state == "cancelled"


def test_wait_timeout_says_the_jobs_actual_state() -> None:
    # No remote worker is registered here, so the job stays queued.
    job = gl.launch(gl.command(["true"]), target="remote")
    try:
        with pytest.raises(gl.JobTimeout) as caught:
            job.wait(timeout=0.5)
        assert caught.value.state == "queued"
        assert "still queued" in str(caught.value) and "running" not in str(caught.value)
    finally:
        job.cancel()


def test_launch_overrides_use_short_names() -> None:
    builder = gl.command(["true"]).override(cpu_cores=1, target="local", timeout=30, name="short")
    spec = builder.spec()
    assert spec.timeout_seconds == 30 and spec.name == "short" and spec.placement.target == "local"
    with pytest.raises(UsageError, match="nonsense"):
        gl.command(["true"], nonsense=1)


def test_bad_spec_fails_in_the_caller_naming_the_field() -> None:
    with pytest.raises(SpecError) as caught:
        gl.launch(gl.command(["true"]).resources(accelerator="cpu", gpus=2))
    assert any(line.startswith("resources.gpu_count:") for line in caught.value.lines)


def test_non_json_arguments_are_refused_at_call_time(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not JSON-serializable"):
        gl.function("calc:mul", object())


def test_remote_decorator_in_a_script_run_as_main(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(
        textwrap.dedent(
            """
            import json, os, sys
            import gpulayer as gl

            @gl.remote(cpu_cores=1, timeout=120, env={"GREETING": "hi"})
            def greet(name, punctuation="!"):
                return {"text": os.environ.get("GREETING", "local") + " " + name + punctuation,
                        "cwd_has_app": os.path.exists("app.py")}

            if __name__ == "__main__":
                here = greet("there")
                job = greet.remote("world", punctuation="?")
                there = job.result(timeout=120)
                try:
                    greet.remote(object())
                    refused = None
                except gl.JobFailed:
                    refused = "jobfailed"
                except Exception as exc:
                    refused = str(exc)
                print(json.dumps({"here": here, "there": there, "job": job.id, "refused": refused}))
            """
        )
    )
    result = subprocess.run(
        [sys.executable, str(app)], capture_output=True, text=True, cwd=tmp_path, timeout=180
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["here"]["text"] == "local there!"  # a plain call runs in-process
    assert out["there"] == {"text": "hi world?", "cwd_has_app": True}  # the script's folder shipped
    assert "not JSON-serializable" in out["refused"]
    status = json.loads(
        subprocess.run(
            [sys.executable, "-m", "gpulayer", "status", out["job"], "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    )
    assert status["state"] == "succeeded"


def test_remote_rejects_bad_options_where_written() -> None:
    with pytest.raises(SpecError):
        gl.remote(profile="no-such-profile")
    with pytest.raises(UsageError):

        def inner() -> None: ...

        gl.remote(inner).remote()


def test_launch_a_plain_function_with_kwargs_split(tmp_path: Path) -> None:
    from tests.support import sdk_functions

    job = gl.launch(sdk_functions.scale, 3, factor=5, timeout=60)
    assert job.result(timeout=60) == 15
    assert job.status()["name"] == "scale"
