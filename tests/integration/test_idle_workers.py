"""Idle workers hold none of the server's threads: with more workers waiting in their claim
long-polls than the HTTP server has worker threads (40), a submit is still answered at once,
and the job wakes only the worker it was placed on. Measured before: 48 open polls took every
thread, and the submit waited for a poll to end."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from gpulayer.errors import ControlPlaneError
from gpulayer.protocol.client import ControlClient
from tests.support.servers import ADMIN_TOKEN, ServerProcess
from tests.unit.test_scheduler_builders import caps

WAITING = 48  # more than the HTTP server's 40 worker threads
POLL_SECONDS = 25.0


def test_a_submit_is_answered_while_more_workers_wait_than_the_server_has_threads(
    tmp_path: Path,
) -> None:
    server = ServerProcess(tmp_path / "server", heartbeat_timeout=120).start()
    try:
        admin = server.client()
        join = admin.request("POST", "/v1/tokens", {"kind": "worker"})["token"]
        workers: list[tuple[str, ControlClient]] = []
        for n in range(WAITING):
            body = {"name": f"idle{n}", "capabilities": caps(cpu_cores=2).model_dump(mode="json")}
            reply = ControlClient(server.url, join).request("POST", "/v1/workers", body)
            workers.append(
                (reply["worker_id"], ControlClient(server.url, reply["token"], timeout=60))
            )

        replies: dict[str, tuple[float, Any]] = {}  # worker: (seconds waited, reply)

        def poll(worker_id: str, client: ControlClient) -> None:
            started = time.monotonic()
            try:
                got = client.request(
                    "POST",
                    f"/v1/workers/{worker_id}/claim",
                    params={"wait": POLL_SECONDS, "signals": 1},
                )
            except ControlPlaneError:
                return  # the server stopped at the end of the test, cutting the poll off
            replies[worker_id] = (time.monotonic() - started, got)

        threads = [threading.Thread(target=poll, args=w, daemon=True) for w in workers]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 20
        while admin.request("GET", "/v1/server")["claim_polls_waiting"] < WAITING:
            assert time.monotonic() < deadline, "the workers' polls never all waited"
            time.sleep(0.05)

        # Every poll waits now. A call well inside their wait is answered: it needs a thread.
        chosen, _ = workers[7]
        quick = ControlClient(server.url, ADMIN_TOKEN, timeout=POLL_SECONDS / 2)
        spec = {
            "workload": {"kind": "command", "command": ["true"]},
            "placement": {"target": "remote", "worker_ids": [chosen]},
        }
        job = quick.submit(spec)
        assert job["state"] in ("queued", "running"), job
        assert quick.request("GET", "/v1/jobs", params={"limit": 5})

        # Only the chosen worker is woken, with its assignment, well before its poll's end;
        # the others still wait.
        deadline = time.monotonic() + POLL_SECONDS - 5
        while chosen not in replies:
            assert time.monotonic() < deadline, "the chosen worker's poll was never answered"
            time.sleep(0.05)
        _, reply = replies[chosen]
        assert [a["job_id"] for a in reply["assignments"]] == [job["id"]]
        assert admin.request("GET", "/v1/server")["claim_polls_waiting"] == WAITING - 1
        assert set(replies) == {chosen}
    finally:
        server.stop()
