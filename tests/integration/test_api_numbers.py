"""Every number the API takes is bounded, and a row stored before it was can never make a
listing fail (real server process, its own store, the real command line)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.support.cli import run_cli
from tests.support.servers import ADMIN_TOKEN, ServerProcess

pytestmark = pytest.mark.slow

_TEN_YEARS = 10 * 365.25 * 86400


def _status(server: ServerProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    import http.client

    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"}
        conn.request(method, path, body=payload, headers=headers)
        response = conn.getresponse()
        data = response.read()
        return response.status, json.loads(data) if data else None
    finally:
        conn.close()


@pytest.mark.parametrize(
    "expires_at", [-1e17, 1e17, 0, time.time() - 60, time.time() + _TEN_YEARS + 86400, 2**63]
)
def test_a_token_expiring_outside_now_to_ten_years_is_refused(
    server: ServerProcess, expires_at: float
) -> None:
    status, reply = _status(
        server, "POST", "/v1/tokens", {"kind": "worker", "expires_at": expires_at}
    )
    assert status == 422, reply
    assert "expires_at" in reply["error"] and "\n" not in reply["error"], reply
    status, listing = _status(server, "GET", "/v1/tokens")
    assert status == 200, listing


def test_a_token_within_ten_years_is_made(server: ServerProcess) -> None:
    later = time.time() + _TEN_YEARS - 86400
    status, reply = _status(server, "POST", "/v1/tokens", {"kind": "worker", "expires_at": later})
    assert status == 200, reply
    status, listing = _status(server, "GET", "/v1/tokens")
    assert status == 200 and any(t["expires_at"] for t in listing), listing


def test_a_bad_row_already_stored_never_fails_a_listing(server: ServerProcess) -> None:
    from gpulayer.control.tokens import hash_token, new_token

    with server.store() as store:
        for index, bad in enumerate([-1e17, 1e17, float("nan"), float("inf")]):
            store.add_token(hash_token(new_token()), "join", f"old{index}", expires_at=bad)
    status, listing = _status(server, "GET", "/v1/tokens")
    assert status == 200, listing
    olds = [t for t in listing if t["name"].startswith("old")]
    assert len(olds) == 4
    assert {t["name"]: t["state"] for t in olds}["old0"] == "expired"
    result = run_cli(["token", "ls"], env=_cli_env(server))
    assert result.returncode == 0, result.stderr


def _cli_env(server: ServerProcess) -> dict[str, str]:
    return {"GPULAYER_SERVER": server.url, "GPULAYER_TOKEN": ADMIN_TOKEN}


def test_the_cli_refuses_an_expiry_past_ten_years_in_one_line(server: ServerProcess) -> None:
    from gpulayer.cli.server_commands import TOKEN_LIFETIME_MAX_SECONDS as said_by_the_cli
    from gpulayer.protocol.messages import TOKEN_LIFETIME_MAX_SECONDS

    assert said_by_the_cli == TOKEN_LIFETIME_MAX_SECONDS
    result = run_cli(
        ["token", "create", "--worker", "--expires", "99999999999w"], env=_cli_env(server)
    )
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--expires" in lines[0], lines
    assert _status(server, "GET", "/v1/tokens")[0] == 200


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/jobs/prune", {"older_than_seconds": 1e300}),
        ("GET", "/v1/jobs/{job}/logs?node=99999999999999999999", None),
        ("GET", "/v1/jobs/{job}/logs?node=-1", None),
        ("GET", "/v1/jobs/{job}/logs?node=5000", None),
        ("POST", "/v1/offers", {"spec": {}, "limit": 10**30}),
        ("POST", "/v1/tokens", {"kind": "worker", "max_workers": 10**30}),
        ("POST", "/v1/workers/w/heartbeat", {"running": [2**64]}),
        ("POST", "/v1/workers", {"name": "w", "capabilities": {"cpu_cores": 10**30}}),
        ("POST", "/v1/workers", {"name": "w", "capabilities": {"memory_gb": 1e308}}),
        (
            "POST",
            "/v1/workers",
            {"name": "w", "capabilities": {"gpus": [{"index": -1, "name": "g"}]}},
        ),
    ],
)
def test_numbers_out_of_range_are_4xx(
    server: ServerProcess, method: str, path: str, body: Any
) -> None:
    job = server.client().submit({"workload": {"kind": "command", "command": ["true"]}})["id"]
    status, reply = _status(server, method, path.format(job=job), body)
    assert 400 <= status < 500, (status, reply)
    assert "\n" not in reply["error"], reply
    # Nothing half-made: no worker registered from a refused report.
    assert server.client().workers(include_gone=True) == []
