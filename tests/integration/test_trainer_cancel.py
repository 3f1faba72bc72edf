"""A cancelled Trainer run on two worker processes keeps what it had: rank 0's checkpoint and
its reports, and a new run resumes from that checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import run_cli
from tests.support.servers import ADMIN_TOKEN, free_port, wait_for_job

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import torch
    from torch import nn
    import gpulayer as gl


    def train_fn(config):
        ctx = gl.train.context()
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        start = 0
        if ctx.resume_dir is not None:
            saved = torch.load(ctx.resume_dir / "model.pt")
            model.load_state_dict(saved["model"])
            start = saved["epoch"] + 1
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        x = torch.randn(64, 4, generator=torch.Generator().manual_seed(ctx.rank))
        y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
        for epoch in range(start, start + config["epochs"]):
            opt.zero_grad()
            loss = nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            opt.step()
            if ctx.rank == 0:
                torch.save({"model": model.state_dict(), "epoch": epoch},
                           gl.train.checkpoint_dir() / "model.pt")
            gl.train.report({"epoch": epoch, "loss": loss.item()})
            time.sleep(config["pause"])
        return {"started_at_epoch": start}


    if __name__ == "__main__":
        mode, port = sys.argv[1], int(sys.argv[2])
        resume = sys.argv[3] if len(sys.argv) > 3 else None
        trainer = gl.Trainer(train_fn, num_workers=2, procs_per_worker=1, target="remote",
                             rendezvous_port=port, resume_from=resume, timeout=300)
        if mode == "launch":
            print("JOB " + trainer.launch({"epochs": 10000, "pause": 0.3}).id)
        else:
            out = trainer.fit({"epochs": 2, "pause": 0})
            print("TRAINRESULT " + json.dumps({"result": out.result}))
    """
)


def run_script(script: Path, server_url: str, *args: str) -> str:
    env = {**os.environ, "GPULAYER_SERVER": server_url, "GPULAYER_TOKEN": ADMIN_TOKEN}
    done = subprocess.run(
        [sys.executable, str(script), *args],
        cwd=script.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def report_lines(client: Any, job_id: str) -> list[dict[str, Any]]:
    prefix = "gpulayer.train.report "
    return [
        json.loads(line["text"][len(prefix) :])
        for line in client.iter_logs(job_id)
        if line["text"].startswith(prefix)
    ]


def test_a_cancelled_trainer_run_keeps_its_checkpoint_and_reports(
    cluster_factory: Any, tmp_path: Path
) -> None:
    cluster = cluster_factory(2)
    client = cluster.client
    project = tmp_path / "project"
    project.mkdir()
    script = project / "train_app.py"
    script.write_text(SCRIPT)
    out = run_script(script, cluster.server.url, "launch", str(free_port()))
    job_id = next(x for x in out.splitlines() if x.startswith("JOB ")).split()[1]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(report_lines(client, job_id)) < 4:
        assert client.job(job_id)["state"] in ("queued", "running"), client.job(job_id)
        time.sleep(0.2)
    assert len(report_lines(client, job_id)) >= 4
    client.cancel(job_id)
    job = wait_for_job(client, job_id, {"cancelled", "failed", "succeeded"}, timeout=90)
    assert job["state"] == "cancelled", job
    # Rank 0's last checkpoint came back with the job.
    paths = {a["path"] for a in client.artifacts(job_id)}
    assert "checkpoint/model.pt" in paths, paths
    # Its reports are kept too, in order, as many as it printed before the end.
    result = job["result"]
    assert isinstance(result, dict), job
    epochs = [m["epoch"] for m in result["metrics"]]
    assert len(epochs) >= 4 and epochs == list(range(len(epochs)))
    assert epochs[-1] >= max(m["epoch"] for m in report_lines(client, job_id)) - 1
    shown = run_cli(
        ["status", job_id],
        env={"GPULAYER_SERVER": cluster.server.url, "GPULAYER_TOKEN": ADMIN_TOKEN},
    )
    assert shown.returncode == 0, shown.stderr
    assert f'"epoch": {epochs[-1]}' in shown.stdout, shown.stdout
    # A new run resumes from the cancelled one's checkpoint.
    resumed = run_script(
        script, cluster.server.url, "fit", str(free_port()), f"job:{job_id}/checkpoint"
    )
    line = next(x for x in resumed.splitlines() if x.startswith("TRAINRESULT "))
    started = json.loads(line[len("TRAINRESULT ") :])["result"]["started_at_epoch"]
    assert started >= 4
