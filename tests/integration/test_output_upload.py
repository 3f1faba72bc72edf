"""A job's outputs reach the control plane on the first try, after the worker's connection has
sat idle for longer than the server keeps an idle connection open."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpulayer.protocol.bundle import create_bundle
from tests.support.cluster import command_job
from tests.support.servers import wait_for_job

pytestmark = pytest.mark.slow

# Longer than the server's keep-alive (uvicorn closes an idle connection after 5 s).
_IDLE_SECONDS = 7

_JOB = (
    "import os, time; time.sleep({idle}); "
    "open(os.path.join(os.environ['GPULAYER_OUTPUT_DIR'], 'out.txt'), 'w').write('done')"
)


def test_outputs_are_stored_without_a_retry(cluster_factory: Any, tmp_path: Path) -> None:
    cluster = cluster_factory(1)
    client = cluster.client
    source = tmp_path / "source"
    source.mkdir()
    (source / "job.py").write_text(_JOB.format(idle=_IDLE_SECONDS))
    bundle = tmp_path / "source.tar.gz"
    create_bundle(source, bundle)
    spec = command_job(["python", "job.py"])
    job_id = client.submit(spec, bundle_id=client.upload_bundle(bundle))["id"]
    job = wait_for_job(client, job_id, {"succeeded", "failed"}, timeout=60)
    assert job["state"] == "succeeded", job
    assert [a["path"] for a in client.artifacts(job_id)] == ["out.txt"]
    worker_log = (cluster.workers[0].home / "worker.log").read_text()
    assert "retrying" not in worker_log, worker_log[-2000:]
    assert "Broken pipe" not in worker_log
