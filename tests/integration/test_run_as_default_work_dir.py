"""`gpulayer worker start --run-as USER` with no --work-dir: the worker prepares a work dir
that USER can reach, starts, and runs jobs as USER."""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest

from gpulayer.worker.entry import shared_work_root
from tests.support.cluster import command_job, submit
from tests.support.servers import wait_for_job, wait_for_workers

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="--run-as needs root"),
]


def test_run_as_with_the_default_work_dir_runs_jobs_as_that_user(cluster_factory: Any) -> None:
    cluster = cluster_factory(0)
    worker = cluster.add_worker("asnobody", None, "--run-as", "nobody")
    root = shared_work_root(worker.home)
    try:
        wait_for_workers(cluster.client, 1)
        job_id = submit(
            cluster.client,
            # /usr/bin's id: the test's own python lies under /root, closed to nobody.
            command_job(["id", "-un"]),
        )
        job = wait_for_job(cluster.client, job_id, {"succeeded", "failed"}, timeout=60)
        log = (worker.home / "worker.log").read_text()
        assert job["state"] == "succeeded", (job["reason"], job["message"], log[-1500:])
        assert "cannot reach" not in log
        lines = cluster.client.logs(job_id)["lines"]
        printed = [line["text"].strip() for line in lines if line["stream"] == "stdout"]
        assert printed == ["nobody"], lines
        assert root.stat().st_mode & 0o777 == 0o711
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
