"""A worker stopped with SIGTERM drains and leaves: the team server marks it `leaving` as it
starts to stop and places nothing on it from then on, so a job submitted meanwhile waits for
(and goes to) another worker instead of being handed to one that is going away and failing
`worker_lost` once its silence is noticed.

Real processes throughout: a team server, `gpulayer worker start` processes, the CLI."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import run_cli
from tests.support.cluster import command_job, submit
from tests.support.servers import (
    ADMIN_TOKEN,
    ServerProcess,
    WorkerProcess,
    wait_for_job,
    wait_for_workers,
)

# Long enough that a worker the server still counts as ready after its process ended is
# handed the next job (the break), short enough for the test to see that job fail.
HEARTBEAT_TIMEOUT = 12.0

# Prints, then on SIGTERM takes a few seconds to end: the worker stays alive while it drains.
_SLOW_TO_STOP = (
    "import signal, sys, time\n"
    "def stop(*_):\n"
    "    time.sleep(4)\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "print('started', flush=True)\n"
    "time.sleep(300)\n"
)


def _wait_for(what: str, check: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _logged(client: Any, job_id: str, text: str) -> bool:
    return any(text in line["text"] for line in client.iter_logs(job_id))


def _workers_cli(url: str) -> list[dict[str, Any]]:
    result = run_cli(
        ["workers", "--all", "--json", "--server", url], env={"GPULAYER_TOKEN": ADMIN_TOKEN}
    )
    assert result.returncode == 0, result.stderr
    found: list[dict[str, Any]] = json.loads(result.stdout)
    return found


@pytest.mark.slow
def test_a_sigterm_worker_is_leaving_at_once_and_gets_no_new_job(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "server", heartbeat_timeout=HEARTBEAT_TIMEOUT).start()
    workers: list[WorkerProcess] = []
    try:
        client = server.client()
        token = client.request("POST", "/v1/tokens", {"kind": "worker"})["token"]
        leaving = WorkerProcess(server.url, token, tmp_path / "w0", "w0").start(0.5)
        workers.append(leaving)
        (w0,) = wait_for_workers(client, 1)
        spec = command_job([sys.executable, "-c", _SLOW_TO_STOP])
        spec["grace_seconds"] = 30
        running = submit(client, spec)
        _wait_for("the first job to start", lambda: _logged(client, running, "started"))

        leaving.signal(15)  # SIGTERM
        log = tmp_path / "w0" / "worker.log"
        _wait_for("the worker to start stopping", lambda: "stopping:" in log.read_text())
        later = submit(client, command_job(["echo", "on another worker"]))
        # The worker is still draining its job (it takes 4 s to end): what the CLI shows now.
        assert leaving.process is not None and leaving.process.poll() is None
        seen_while_draining = {w["name"]: w["state"] for w in _workers_cli(server.url)}
        queued_while_draining = client.job(later)

        assert leaving.process.wait(timeout=90) == 0, log.read_text()[-3000:]
        other = WorkerProcess(server.url, token, tmp_path / "w1", "w1").start(0.5)
        workers.append(other)
        ended = wait_for_job(
            client, later, {"succeeded", "failed", "cancelled"}, timeout=HEARTBEAT_TIMEOUT + 60
        )
        first = wait_for_job(client, running, {"succeeded", "failed", "cancelled"})
        attempts = client.job(later)["attempts"]
        # Once silent for the heartbeat timeout, the worker that left is lost as any other.
        _wait_for(
            "the worker that left to be lost",
            lambda: {w["name"]: w["state"] for w in client.workers()}.get("w0") == "lost",
            timeout=HEARTBEAT_TIMEOUT * 3,
        )
        final = {w["name"]: w for w in _workers_cli(server.url)}
    finally:
        for worker in workers:
            worker.stop()
        server.stop()

    # The job submitted while w0 stopped was never given to it: it waited, then ran on w1.
    assert ended["state"] == "succeeded", ended
    assert [a["worker_name"] for a in attempts] == ["w1"], attempts
    assert seen_while_draining.get("w0") == "leaving", seen_while_draining
    assert queued_while_draining["state"] == "queued", queued_while_draining
    # The job w0 was running ended as a SIGTERM'd worker's jobs always did.
    assert first["state"] == "failed" and first["reason"] == "worker_lost", first
    assert final["w0"]["id"] == w0["id"]
    assert final["w0"]["state"] == "lost", final["w0"]


@pytest.mark.slow
def test_only_the_worker_itself_or_an_admin_may_say_it_leaves(tmp_path: Path) -> None:
    from gpulayer.errors import ForbiddenError, NotFoundError
    from gpulayer.protocol.client import ControlClient
    from gpulayer.worker.identity import FILE_NAME, load_identity

    server = ServerProcess(tmp_path / "server").start()
    workers: list[WorkerProcess] = []
    try:
        admin = server.client()
        token = admin.request("POST", "/v1/tokens", {"kind": "worker"})["token"]
        for name in ("w0", "w1"):
            workers.append(WorkerProcess(server.url, token, tmp_path / name, name).start(0.5))
        ids = {w["name"]: str(w["id"]) for w in wait_for_workers(admin, 2)}
        # Written once the registration's answer came back: after the server listed it.
        saved = _wait_for(
            "w1's saved identity", lambda: load_identity(tmp_path / "w1" / FILE_NAME, server.url)
        )
        assert saved.worker_id == ids["w1"]
        other = ControlClient(server.url, saved.token)
        joiner = ControlClient(server.url, token)
        for caller in (other, joiner):
            with pytest.raises(ForbiddenError):
                caller.request("POST", f"/v1/workers/{ids['w0']}/leave")
        with pytest.raises(NotFoundError):
            admin.request("POST", "/v1/workers/w-nobody/leave")
        states = {w["name"]: w["state"] for w in admin.workers()}
        assert states == {"w0": "ready", "w1": "ready"}, states
        # Its own credential: leaving at once, and no heartbeat makes it ready again.
        assert other.request("POST", f"/v1/workers/{ids['w1']}/leave")["state"] == "leaving"
        deadline = time.monotonic() + 2.0  # four of its heartbeats
        while time.monotonic() < deadline:
            states = {w["name"]: w["state"] for w in admin.workers()}
            assert states == {"w0": "ready", "w1": "leaving"}, states
            time.sleep(0.1)
    finally:
        for worker in workers:
            worker.stop()
        server.stop()
