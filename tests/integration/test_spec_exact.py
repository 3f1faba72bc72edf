"""The JobSpec's patterns are exact, and a job file is judged the same by `validate`, `submit`
and the API: real command lines against a real server, with real job files.

A value that only looks right (a name with a trailing newline, a version in Arabic-Indic
digits) is refused by all three with one line naming the field, and nothing is stored. An
input's empty artifact is refused by `submit` as by `validate`: it is not turned into the job
file's folder first.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.cli import run_cli
from tests.support.servers import ADMIN_TOKEN, ServerProcess, server_on

pytestmark = pytest.mark.slow


def _job(**extra: Any) -> dict[str, Any]:
    return {
        "workload": {"kind": "command", "command": ["true"]},
        "placement": {"target": "remote"},
        **extra,
    }


def _cuda(**resources: Any) -> dict[str, Any]:
    return _job(resources={"accelerator": "cuda", **resources})


# (case, job file, the field the refusal names)
LOOKALIKES: list[tuple[str, dict[str, Any], str]] = [
    ("name-trailing-newline", _job(name="job\n"), "name"),
    (
        "capability-arabic-indic",
        _cuda(min_cuda_compute_capability="\u0668.\u0660"),
        "resources.min_cuda_compute_capability",
    ),
    (
        "capability-trailing-newline",
        _cuda(min_cuda_compute_capability="8.0\n"),
        "resources.min_cuda_compute_capability",
    ),
    ("gpu-model-trailing-newline", _cuda(gpu_models=["A100\n"]), "resources.gpu_models.0"),
    (
        "entrypoint-trailing-newline",
        {**_job(), "workload": {"kind": "function", "entrypoint": "pkg.mod:fn\n"}},
        "workload.entrypoint",
    ),
    ("env-name-trailing-newline", _job(env={"EPOCHS\n": "3"}), "env"),
    (
        "framework-trailing-newline",
        _job(resources={"frameworks": {"torch\n": ">=2"}}),
        "resources.frameworks",
    ),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with server_on("sqlite", tmp_path_factory.mktemp("exact") / "server") as process:
        yield process


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
        yield client


def _env(server: ServerProcess, home: Path) -> dict[str, str]:
    return {
        "GPULAYER_SERVER": server.url,
        "GPULAYER_TOKEN": ADMIN_TOKEN,
        "GPULAYER_HOME": str(home),
    }


def _stored(http: httpx.Client) -> list[dict[str, Any]]:
    reply = http.get("/v1/jobs", params={"limit": 1000})
    assert reply.status_code == 200, reply.text
    jobs = reply.json()
    return list(jobs["jobs"] if isinstance(jobs, dict) else jobs)


def _error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize(("case", "job", "field"), LOOKALIKES, ids=[c[0] for c in LOOKALIKES])
def test_lookalike_values_are_refused_everywhere(
    server: ServerProcess,
    http: httpx.Client,
    tmp_path: Path,
    case: str,
    job: dict[str, Any],
    field: str,
) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    job_file = folder / "job.json"
    job_file.write_text(json.dumps(job))
    before = len(_stored(http))

    checked = run_cli(["validate", "-f", str(job_file)], cwd=folder)
    assert checked.returncode == 2, (case, checked.stdout[-500:])
    line = _error_line(checked.stderr)
    assert line.startswith(f"error: {field}"), line

    sent = run_cli(
        ["submit", "-f", str(job_file), "--detach"], cwd=folder, env=_env(server, tmp_path)
    )
    assert sent.returncode == 2, (case, sent.stdout, sent.stderr)
    assert _error_line(sent.stderr) == line

    reply = http.post("/v1/jobs", json={"spec": job})
    assert reply.status_code in (400, 422), reply.text
    assert field in reply.text
    assert len(_stored(http)) == before


def test_empty_artifact_is_refused_by_submit_as_by_validate(
    server: ServerProcess, http: httpx.Client, tmp_path: Path
) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "private.txt").write_text("not an input")
    job_file = folder / "job.json"
    job_file.write_text(json.dumps(_job(inputs=[{"artifact": "", "path": "data"}])))
    before = len(_stored(http))

    checked = run_cli(["validate", "-f", str(job_file)], cwd=folder)
    assert checked.returncode == 2
    line = _error_line(checked.stderr)
    assert line.startswith("error: inputs.0.artifact"), line

    env = _env(server, tmp_path)
    sent = run_cli(["submit", "-f", str(job_file), "--detach"], cwd=folder, env=env)
    assert sent.returncode == 2, (sent.stdout, sent.stderr)
    assert _error_line(sent.stderr) == line

    # A flag's empty artifact ("--input :data" is refused by its parser; a file's is not).
    schedule = folder / "schedule.json"
    schedule.write_text(
        json.dumps(
            {
                "name": "nightly",
                "cron": "0 4 * * *",
                "job": _job(inputs=[{"artifact": "", "path": "data"}]),
            }
        )
    )
    applied = run_cli(["schedule", "apply", "-f", str(schedule)], cwd=folder, env=env)
    assert applied.returncode == 2, (applied.stdout, applied.stderr)
    assert "job.inputs.0.artifact" in applied.stderr
    assert len(_stored(http)) == before
    schedules = http.get("/v1/schedules")
    assert schedules.status_code == 200
    listed = schedules.json()
    assert not (listed["schedules"] if isinstance(listed, dict) else listed)
