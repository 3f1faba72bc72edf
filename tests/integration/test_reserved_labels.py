"""`gpulayer.*` labels are the control plane's own: a submitted spec carrying one is refused
naming it, and an array is made whole by the server from one request, so no other request can
put jobs into it or hold its jobs back.

A real server process, the real command line, and the local control plane the command line
starts on its own."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import run_cli
from tests.support.daemon import stop_local_control_plane
from tests.support.servers import ADMIN_TOKEN, ServerProcess

JOB: dict[str, Any] = {
    "workload": {"kind": "command", "command": ["true"]},
    "placement": {"target": "remote"},
}


def post(server: ServerProcess, path: str, body: Any) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"}
    try:
        conn.request("POST", path, body=json.dumps(body), headers=headers)
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read() or b"null")
    finally:
        conn.close()


def cli_env(server: ServerProcess, tmp_path: Path) -> dict[str, str]:
    return {
        "GPULAYER_SERVER": server.url,
        "GPULAYER_TOKEN": ADMIN_TOKEN,
        "GPULAYER_HOME": str(tmp_path / "client"),
    }


def test_a_reserved_label_is_refused_naming_it_and_nothing_is_stored(
    server: ServerProcess, tmp_path: Path
) -> None:
    stalled = {**JOB, "labels": {"gpulayer.array": "a-0123456789", "gpulayer.array.limit": "0"}}
    status, answer = post(server, "/v1/jobs", {"spec": stalled})
    assert status == 422
    assert "labels.gpulayer.array.limit: reserved" in answer["error"]
    status, answer = post(server, "/v1/jobs", [{"spec": JOB}, {"spec": stalled}])
    assert status == 422
    assert "jobs[1].labels.gpulayer.array: reserved" in answer["error"]
    run_of = {**JOB, "labels": {"gpulayer.dev/schedule": "nightly"}}
    schedule = {"name": "s", "cron": "0 0 1 1 *", "job": run_of}
    status, answer = post(server, "/v1/schedules", {"schedule": schedule})
    assert status == 422
    assert "job.labels.gpulayer.dev/schedule: reserved" in answer["error"]

    project = tmp_path / "project"
    project.mkdir()
    done = run_cli(
        ["submit", "-d", "--target", "remote", "--label", "gpulayer.array.limit=0", "--", "true"],
        env=cli_env(server, tmp_path),
        cwd=project,
    )
    assert done.returncode == 2, done.stderr
    assert "gpulayer.array.limit" in done.stderr
    assert server.client().jobs(limit=100) == []


def test_an_array_is_bound_to_the_request_that_made_it(
    server: ServerProcess, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    done = run_cli(
        ["submit", "-d", "--target", "remote", "--array", "0-3%1", "--", "true"],
        env=cli_env(server, tmp_path),
        cwd=project,
    )
    assert done.returncode == 0, done.stderr
    array_id = done.stdout.strip().splitlines()[-1]
    client = server.client()
    members = client.request("GET", f"/v1/arrays/{array_id}")
    assert [job["labels"]["gpulayer.array.index"] for job in members] == ["0", "1", "2", "3"]
    assert {job["labels"]["gpulayer.array.limit"] for job in members} == {"1"}

    # Another request can neither add a job to it nor put its jobs under another limit.
    joining = {**JOB, "labels": {"gpulayer.array": array_id, "gpulayer.array.index": "9"}}
    assert post(server, "/v1/jobs", {"spec": joining})[0] == 422
    holding = {**JOB, "labels": {"gpulayer.array": array_id, "gpulayer.array.limit": "0"}}
    assert post(server, "/v1/jobs", [{"spec": holding}])[0] == 422
    assert len(client.request("GET", f"/v1/arrays/{array_id}")) == 4

    # An array asked for over the API gets an id of its own, whatever labels it asked for.
    status, made = post(server, "/v1/jobs", {"spec": JOB, "array": {"indices": [5, 6]}})
    assert status == 201
    assert len({job["labels"]["gpulayer.array"] for job in made}) == 1
    assert made[0]["labels"]["gpulayer.array"] != array_id
    assert "gpulayer.array.limit" not in made[0]["labels"]

    status, refused = post(server, "/v1/jobs", {"spec": JOB, "array": {"indices": [0], "limit": 0}})
    assert status == 422 and "array.limit" in refused["error"]
    status, refused = post(server, "/v1/jobs", {"spec": JOB, "array": {"indices": [1, 1]}})
    assert status == 400 and refused["error"].startswith("array.indices:")
    assert len(client.jobs(limit=100)) == 6


@pytest.mark.slow
def test_an_array_on_the_local_control_plane_is_made_by_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    project = tmp_path / "project"
    project.mkdir()
    (project / "marker.py").write_text(
        "import os, pathlib\npathlib.Path(os.environ['GPULAYER_ARRAY_INDEX']).write_text('ran')\n"
    )
    env = {"GPULAYER_HOME": str(home), "GPULAYER_SERVER": "", "GPULAYER_TOKEN": ""}
    try:
        done = run_cli(
            ["submit", "--target", "local", "--array", "0-2", "--", "python", "marker.py"],
            env=env,
            cwd=project,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr
        assert "3 succeeded" in done.stderr
        assert sorted(p.name for p in project.iterdir() if p.name != "marker.py") == [
            "0",
            "1",
            "2",
        ]
        refused = run_cli(
            ["submit", "-d", "--label", "gpulayer.array.index=1", "--", "true"],
            env=env,
            cwd=project,
        )
        assert refused.returncode == 2 and "gpulayer.array.index" in refused.stderr
    finally:
        stop_local_control_plane(home)
