"""Careless or hostile input to a real server process: a 4xx naming the field, never a 5xx,
and the server keeps answering (listing included) afterwards."""

from __future__ import annotations

import io
import json
import sqlite3
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.cli import run_cli
from tests.support.servers import ADMIN_TOKEN, ServerProcess, server_on

INT64_OVER = 2**63  # past any store integer
INT32_OVER = 2**31  # past a PostgreSQL INTEGER id
HUGE = 10**30


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """The same input against both stores: PostgreSQL is stricter about NUL, lengths, int64."""
    with server_on(request.param, tmp_path_factory.mktemp("bad-input") / "server") as process:
        yield process


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
        yield client


def raw_json(http: httpx.Client, method: str, path: str, text: str) -> httpx.Response:
    """Send JSON text as it is: escapes such as \\ud800 reach the server unparsed."""
    return http.request(method, path, content=text, headers={"Content-Type": "application/json"})


def spec(**extra: Any) -> dict[str, Any]:
    return {
        "workload": {"kind": "command", "command": ["true"]},
        "placement": {"target": "remote"},
        **extra,
    }


def a_job(http: httpx.Client) -> str:
    reply = http.post("/v1/jobs", json={"spec": spec()})
    assert reply.status_code == 201, reply.text
    return str(reply.json()["id"])


def still_answers(http: httpx.Client) -> None:
    assert http.get("/v1/health").status_code == 200
    listing = http.get("/v1/jobs")
    assert listing.status_code == 200, listing.text


# --- text no store can hold ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field_json", "named"),
    [
        ('"labels": {"team": "\\ud800"}', "labels.team"),
        ('"labels": {"\\udfff": "x"}', "labels"),
        ('"env": {"A": "x\\u0000y"}', "env.A"),
        ('"workload": {"kind": "command", "command": ["echo", "\\udc80"]}', "workload.command.1"),
    ],
)
def test_lone_surrogates_and_nul_are_refused_at_submit(
    http: httpx.Client, field_json: str, named: str
) -> None:
    body = (
        '{"spec": {"workload": {"kind": "command", "command": ["true"]}, '
        '"placement": {"target": "remote"}, ' + field_json + "}}"
    )
    reply = raw_json(http, "POST", "/v1/jobs", body)
    assert reply.status_code == 422, reply.text
    assert named in reply.json()["error"]
    still_answers(http)


def test_cli_refuses_undecodable_arguments_with_exit_2(
    server: ServerProcess, tmp_path: Path
) -> None:
    # Bytes that are not UTF-8 reach Python's argv as lone surrogates.
    bad = b"team=\xff\xfe".decode("utf-8", "surrogateescape")
    result = run_cli(
        [
            "submit",
            "--server",
            server.url,
            "--target",
            "remote",
            "-d",
            "--label",
            bad,
            "--",
            "true",
        ],
        env={"GPULAYER_TOKEN": ADMIN_TOKEN},
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert "--label team: " in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    listed = run_cli(["ls", "--server", server.url], env={"GPULAYER_TOKEN": ADMIN_TOKEN})
    assert listed.returncode == 0, listed.stderr


def test_listing_survives_bad_rows_already_in_the_store(
    server: ServerProcess, http: httpx.Client
) -> None:
    """Rows written before input was checked (or by hand) must not take `ls` down for good."""
    if server.database_url:
        pytest.skip("rows are written by hand into the SQLite file")
    job_id = a_job(http)
    broken_id = a_job(http)
    database = server.home / "server.db"
    with sqlite3.connect(database, timeout=30) as db:
        db.execute(
            "UPDATE jobs SET labels = ?, message = ? WHERE id = ?",
            (json.dumps({"team": "\ud800"}), "x", job_id),
        )
        db.execute("UPDATE jobs SET spec = ?, labels = ? WHERE id = ?", ("{", "[", broken_id))
    listing = http.get("/v1/jobs")
    assert listing.status_code == 200, listing.text
    views = {j["id"]: j for j in listing.json()}
    assert views[job_id]["labels"] == {"team": "\ufffd"}
    assert broken_id in views
    assert http.get(f"/v1/jobs/{broken_id}").status_code == 200
    listed = run_cli(["ls", "--server", server.url], env={"GPULAYER_TOKEN": ADMIN_TOKEN})
    assert listed.returncode == 0, listed.stderr


# --- numbers out of range -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", f"/v1/jobs?limit={HUGE}", None),
        ("GET", "/v1/jobs?limit=-5", None),
        ("POST", f"/v1/attempts/{INT64_OVER}/finish", {"state": "failed"}),
        ("POST", f"/v1/attempts/{INT32_OVER}/finish", {"state": "failed"}),
        ("GET", f"/v1/jobs/j-x/logs?after={INT32_OVER}", None),
        ("POST", f"/v1/attempts/{HUGE}/logs", {"lines": [["stdout", "x"]]}),
        ("POST", "/v1/attempts/1/finish", {"state": "failed", "exit_code": INT64_OVER}),
        ("POST", "/v1/workers/w-x/claim?wait=nan", None),
    ],
)
def test_integers_out_of_range_are_4xx(
    http: httpx.Client, method: str, path: str, body: Any
) -> None:
    reply = http.request(method, path, json=body)
    assert 400 <= reply.status_code < 500, (reply.status_code, reply.text)
    still_answers(http)


def test_log_cursor_out_of_range_is_4xx(http: httpx.Client) -> None:
    job_id = a_job(http)
    reply = http.get(f"/v1/jobs/{job_id}/logs", params={"after": str(HUGE)})
    assert reply.status_code == 422, reply.text
    assert "after" in reply.text


def test_log_node_the_job_does_not_have_is_400_naming_it(http: httpx.Client) -> None:
    job_id = a_job(http)
    reply = http.get(f"/v1/jobs/{job_id}/logs", params={"node": "1"})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"].startswith(f"node: job {job_id} has 1 node (ranks 0 to 0)")
    assert http.get(f"/v1/jobs/{job_id}/logs", params={"node": "0"}).status_code == 200


@pytest.mark.parametrize("node", ["-1", "1024", str(HUGE)])
def test_log_node_no_job_could_have_is_422_naming_it(http: httpx.Client, node: str) -> None:
    # A node rank is bounded as a spec's num_workers is: below 1024, whatever the job.
    job_id = a_job(http)
    reply = http.get(f"/v1/jobs/{job_id}/logs", params={"node": node})
    assert reply.status_code == 422, reply.text
    assert reply.json()["error"].startswith("query.node: ")


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"state": "runing"}, "state: 'runing' is not a job state; did you mean running?"),
        ({"label": "team"}, "label: expected KEY=VALUE"),
        ({"schedule": " "}, "schedule: give a schedule's name"),
    ],
)
def test_job_listing_filters_are_400_naming_the_parameter(
    http: httpx.Client, params: dict[str, str], named: str
) -> None:
    reply = http.get("/v1/jobs", params=params)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"].startswith(named)


# --- heartbeats of the wrong shape --------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    ['{"running": "abc"}', '{"running": [["x"]]}', "[1, 2]", '"running"', '{"running": [1e400]}'],
)
def test_wrong_heartbeat_shapes_are_422(http: httpx.Client, body: str) -> None:
    reply = raw_json(http, "POST", "/v1/workers/w-nobody/heartbeat", body)
    assert reply.status_code == 422, reply.text
    still_answers(http)


# --- archives that would write outside their folder ---------------------------------------------


def tar_bytes(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return buffer.getvalue()


def entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info


UNSAFE_ARCHIVES = {
    "climbs": tar_bytes((entry("../escaped.txt"), b"x")),
    "absolute": tar_bytes((entry("/tmp/gpulayer-absolute.txt"), b"x")),
    "device": tar_bytes((entry("dev", tarfile.CHRTYPE), b"")),
    "link-out": tar_bytes(
        (entry("out", tarfile.SYMTYPE, "/etc"), b""), (entry("out/passwd"), b"x")
    ),
    "not-a-tar": b"this is not an archive",
    "empty": b"",
}


def an_attempt(http: httpx.Client) -> int:
    """A job running on a worker registered for the purpose: its attempt takes outputs."""
    name = f"archive-{time.monotonic_ns()}"
    registration = {"name": name, "capabilities": {"cpu_cores": 1, "memory_gb": 1}}
    reply = http.post("/v1/workers", json=registration)
    assert reply.status_code == 200, reply.text
    worker_id = reply.json()["worker_id"]
    pinned = spec(placement={"target": "remote", "worker_ids": [worker_id]})
    assert http.post("/v1/jobs", json={"spec": pinned}).status_code == 201
    claimed = http.post(f"/v1/workers/{worker_id}/claim", params={"wait": 10})
    assert claimed.status_code == 200 and claimed.json(), claimed.text
    return int(claimed.json()[0]["attempt_id"])


@pytest.mark.parametrize("kind", sorted(UNSAFE_ARCHIVES))
def test_unsafe_output_archives_are_400(
    server: ServerProcess, http: httpx.Client, kind: str
) -> None:
    attempt_id = an_attempt(http)
    reply = http.put(f"/v1/attempts/{attempt_id}/outputs", content=UNSAFE_ARCHIVES[kind])
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]  # names the upload and the member that is refused
    assert error.startswith("outputs: ") or "bundle" in error or "archive" in error, error
    assert not (server.home / "escaped.txt").exists()
    assert not Path("/tmp/gpulayer-absolute.txt").exists()
    still_answers(http)


@pytest.mark.parametrize("kind", sorted(UNSAFE_ARCHIVES))
def test_unsafe_source_bundles_are_400_at_upload(
    server: ServerProcess, http: httpx.Client, kind: str
) -> None:
    reply = http.put("/v1/bundles", content=UNSAFE_ARCHIVES[kind])
    assert reply.status_code == 400, reply.text
    assert list((server.home / "incoming").glob("*.tar.gz")) == []  # nothing half-kept
    still_answers(http)
