"""With a server configured, a job that names no target goes to that server's workers (the
command line, @gl.remote, gl.launch and gl.Trainer alike); a target that is named still wins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import run_cli
from tests.support.servers import ADMIN_TOKEN, free_port, wait_for_job

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import gpulayer as gl


    @gl.remote(timeout=120)
    def double(x):
        return 2 * x


    def train_fn(config):
        gl.train.report({"step": 1, "loss": 0.5})
        return {"seen": config["n"]}


    if __name__ == "__main__":
        port = int(sys.argv[1])
        doubled = double.remote(21)
        launched = gl.launch(double, 4)
        trainer = gl.Trainer(train_fn, rendezvous_port=port, timeout=120)
        trained = trainer.launch({"n": 3}).result(timeout=120)
        print("OUT " + json.dumps({
            "doubled": doubled.result(timeout=120),
            "doubled_job": doubled.id,
            "launched": launched.result(timeout=120),
            "launched_job": launched.id,
            "trained_type": type(trained).__name__,
            "trained": trained.result,
            "trained_job": trained.job_id,
            "metrics": trained.metrics,
        }))
    """
)


def _server_env(url: str) -> dict[str, str]:
    return {"GPULAYER_SERVER": url, "GPULAYER_TOKEN": ADMIN_TOKEN}


def test_sdk_jobs_without_a_target_go_to_the_servers_workers(
    cluster_factory: Any, tmp_path: Path
) -> None:
    cluster = cluster_factory(1)
    project = tmp_path / "project"
    project.mkdir()
    script = project / "app.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(free_port())],
        cwd=project,
        env={**os.environ, **_server_env(cluster.server.url)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("OUT "))
    out = json.loads(line[len("OUT ") :])
    assert (out["doubled"], out["launched"]) == (42, 8)
    assert out["trained_type"] == "TrainResult"
    assert out["trained"] == {"seen": 3}
    assert out["metrics"][0]["loss"] == 0.5
    client = cluster.client
    for key in ("doubled_job", "launched_job", "trained_job"):
        job = client.job(out[key])
        assert job["target"] == "remote", job
        assert job["attempts"][0]["worker_name"] == cluster.workers[0].name


def test_cli_submit_without_a_target_goes_to_the_server_and_a_named_one_wins(
    cluster_factory: Any, tmp_path: Path
) -> None:
    cluster = cluster_factory(1)
    env = _server_env(cluster.server.url)
    result = run_cli(["submit", "-d", "--", "true"], env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    job = wait_for_job(cluster.client, result.stdout.strip(), {"succeeded", "failed"})
    assert (job["target"], job["state"]) == ("remote", "succeeded")
    before = cluster.client.jobs()
    named = run_cli(["submit", "-d", "--target", "local", "--", "true"], env=env, cwd=tmp_path)
    assert named.returncode == 2, named.stderr
    assert "no local worker is registered" in named.stderr
    assert "hint: a team server runs jobs on its workers" in named.stderr
    assert cluster.client.jobs() == before  # refused: nothing kept
