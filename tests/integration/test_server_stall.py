"""A stalled server never marks healthy workers lost: a worker's silence counts only while the
server itself could have heard it (real server and worker processes, the server frozen)."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest

from tests.support.body_flood import MIB, json_body, send
from tests.support.cluster import command_job, submit
from tests.support.servers import ADMIN_TOKEN, wait_for_job

pytestmark = pytest.mark.slow

_TIMEOUT = 2.0


def _running_on_worker(client: Any, job_id: str) -> None:
    wait_for_job(client, job_id, {"running"}, timeout=60)


def test_a_frozen_server_loses_no_healthy_worker(cluster_factory: Any) -> None:
    cluster = cluster_factory(1, heartbeat_timeout=_TIMEOUT)
    client = cluster.client
    job_id = submit(client, command_job(["sleep", "6"]))
    _running_on_worker(client, job_id)
    server = cluster.server.process
    assert server is not None
    os.kill(server.pid, signal.SIGSTOP)
    try:
        # Frozen for three heartbeat timeouts (a span of time, not a wait for something):
        # the worker's calls wait in the server's socket meanwhile.
        time.sleep(3 * _TIMEOUT)
    finally:
        os.kill(server.pid, signal.SIGCONT)
    job = wait_for_job(client, job_id, {"succeeded", "failed", "cancelled"}, timeout=60)
    assert job["state"] == "succeeded", job
    attempts: Any = job["attempts"]
    assert [a["state"] for a in attempts] == ["succeeded"], attempts
    assert [w["state"] for w in client.workers(include_gone=True)] == ["ready"]


def test_a_worker_that_really_stops_is_still_lost(cluster_factory: Any) -> None:
    cluster = cluster_factory(1, heartbeat_timeout=_TIMEOUT)
    client = cluster.client
    job_id = submit(client, command_job(["sleep", "60"]))
    _running_on_worker(client, job_id)
    cluster.workers[0].kill_everything()
    job = wait_for_job(client, job_id, {"failed"}, timeout=30)
    assert job["reason"] == "worker_lost", job


def test_a_busy_loop_loses_no_healthy_worker(cluster_factory: Any) -> None:
    """Big authenticated bodies keep the server's loop and threads busy; the worker's job
    still ends as it should."""
    cluster = cluster_factory(1, heartbeat_timeout=_TIMEOUT)
    client = cluster.client
    job_id = submit(client, command_job(["sleep", "5"]))
    _running_on_worker(client, job_id)
    body = json_body(30 * MIB)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {ADMIN_TOKEN}"}
    stop = threading.Event()

    def flood() -> None:
        while not stop.is_set():
            send(cluster.server.host, cluster.server.port, "POST", "/v1/jobs", body, headers)

    threads = [threading.Thread(target=flood) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        job = wait_for_job(client, job_id, {"succeeded", "failed", "cancelled"}, timeout=120)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
    assert job["state"] == "succeeded", job
