"""A team server never reads a folder a client names: a job, a list of jobs or a schedule
that names a `working_dir` and sends no bundle is refused, naming the field, and nothing of
it is kept (the server once bundled that folder of its own machine and ran it remotely).

A real server process; the requests as any HTTP client sends them."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any

from tests.support.servers import ADMIN_TOKEN, ServerProcess

JOB = {
    "workload": {"kind": "command", "command": ["cat", "ssh_host_ed25519_key"]},
    "placement": {"target": "remote"},
}


def post(server: ServerProcess, path: str, body: Any) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"}
    try:
        conn.request("POST", path, body=json.dumps(body), headers=headers)
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read() or b"null")
    finally:
        conn.close()


def test_a_working_dir_without_a_bundle_is_refused_and_nothing_is_kept(tmp_path: Path) -> None:
    secret = tmp_path / "server-private"
    secret.mkdir()
    (secret / "ssh_host_ed25519_key").write_text("PRIVATE KEY\n")
    server = ServerProcess(tmp_path / "server").start()
    try:
        tries = [
            ("/v1/jobs", {"spec": JOB, "working_dir": "/etc/ssh"}, "working_dir"),
            ("/v1/jobs", {"spec": JOB, "working_dir": str(secret)}, "working_dir"),
            ("/v1/jobs", [{"spec": JOB}, {"spec": JOB, "working_dir": str(secret)}], "jobs[1]"),
            (
                "/v1/schedules",
                {
                    "schedule": {"name": "s", "cron": "0 0 1 1 *", "job": JOB},
                    "working_dir": str(secret),
                },
                "working_dir",
            ),
        ]
        for path, body, field in tries:
            status, answer = post(server, path, body)
            assert 400 <= status < 500, (path, status, answer)
            assert field in answer["error"] and "\n" not in answer["error"], answer
        client = server.client()
        assert client.jobs(limit=100) == []
        assert client.request("GET", "/v1/schedules") == []
        bundles = server.home / "bundles"
        assert not bundles.exists() or list(bundles.iterdir()) == []
        # The same job naming no folder is taken.
        status, _ = post(server, "/v1/jobs", {"spec": JOB})
        assert status == 201
    finally:
        server.stop()
