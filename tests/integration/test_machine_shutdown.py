"""A machine going away signals every process on it at once, as a shutdown or the end of a
Slurm step does: a job killed by that signal before its worker handled its own did not fail,
its machine went away. Real server and worker processes."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import Cluster, command_job, wait_for_workers
from tests.support.procs import wait_until
from tests.support.servers import wait_for_job

pytestmark = pytest.mark.slow


def _run_until_started(cluster: Cluster, worker_name: str, tmp_path: Path) -> tuple[str, int]:
    pid_file = tmp_path / f"{worker_name}.pid"
    spec = command_job(["sh", "-c", f"echo $$ > {pid_file}; exec sleep 300"])
    spec["placement"] = {"target": "remote", "worker_labels": {"name": worker_name}}
    job_id = cluster.client.submit(spec)["id"]
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), 60, "the job to start")
    return job_id, int(pid_file.read_text())


def _attempt(cluster: Cluster, job_id: str) -> dict[str, Any]:
    job = wait_for_job(cluster.client, job_id, {"failed", "succeeded", "queued"}, timeout=60)
    return {"state": job["state"], "reason": job["reason"], "message": job["message"]}


def test_a_job_killed_with_its_rented_machine_ends_with_the_machine(
    cluster_factory: Any, tmp_path: Path
) -> None:
    cluster = cluster_factory(0)
    rented = cluster.add_worker("rented", {"name": "rented"}, "--instance-request-id", "r-gone")
    wait_for_workers(cluster.client, 1)
    job_id, pid = _run_until_started(cluster, "rented", tmp_path)
    # The job's signal first; the worker learns of its own once it has seen the job end (its
    # process reaped), as when a worker's signal handler runs a moment after the job died.
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not Path(f"/proc/{pid}").exists(), 10, "the worker to reap the job")
    rented.signal(signal.SIGTERM)
    ended = _attempt(cluster, job_id)
    assert (ended["state"], ended["reason"]) == ("failed", "preempted"), ended
    assert ended["message"] == "the machine is shutting down (killed by SIGTERM)", ended


def test_a_job_killed_from_outside_its_worker_still_fails_by_its_exit(
    cluster_factory: Any, tmp_path: Path
) -> None:
    cluster = cluster_factory(0)
    cluster.add_worker("rented", {"name": "rented"}, "--instance-request-id", "r-here")
    cluster.add_worker("lab", {"name": "lab"})
    wait_for_workers(cluster.client, 2)
    for name in ("rented", "lab"):
        job_id, pid = _run_until_started(cluster, name, tmp_path)
        started = time.monotonic()
        os.kill(pid, signal.SIGKILL)  # say, the kernel's OOM killer: the worker lives on
        ended = _attempt(cluster, job_id)
        assert (ended["state"], ended["reason"], ended["message"]) == (
            "failed",
            "exit_code",
            "killed by SIGKILL",
        ), (name, ended)
        if name == "lab":
            # Only a rented machine's worker waits to see whether it is stopping too.
            assert time.monotonic() - started < 5, name
