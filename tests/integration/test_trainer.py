"""gl.Trainer on two worker processes: train_fn defined in the user's own script, 2 nodes,
rank 0's value, reports and checkpoint back, and a second run resuming from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import ADMIN_TOKEN, free_port

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    import torch.distributed as dist
    from torch import nn
    import gpulayer as gl


    def train_fn(config):
        ctx = gl.train.context()
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        if ctx.resume_dir is not None:
            model.load_state_dict(torch.load(ctx.resume_dir / "model.pt"))
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(ctx.rank)
        x = torch.randn(64, 4, generator=gen)
        y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
        for epoch in range(config["epochs"]):
            opt.zero_grad()
            loss = nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            opt.step()
            gl.train.report({"epoch": epoch, "loss": loss.item()})
        if ctx.rank == 0:
            torch.save(model.state_dict(), gl.train.checkpoint_dir() / "model.pt")
        return {"world_size": ctx.world_size, "num_nodes": ctx.num_nodes,
                "resumed": ctx.resume_dir is not None}


    if __name__ == "__main__":
        port, resume = int(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else None)
        trainer = gl.Trainer(train_fn, num_workers=2, procs_per_worker=2, target="remote",
                             rendezvous_port=port, resume_from=resume, timeout=300)
        out = trainer.fit({"epochs": 15})
        print("TRAINRESULT " + json.dumps({"job_id": out.job_id, "result": out.result,
                                           "metrics": out.metrics,
                                           "checkpoint": out.checkpoint}))
    """
)


def run_script(script: Path, server_url: str, *args: str) -> dict[str, Any]:
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
    line = next(x for x in done.stdout.splitlines() if x.startswith("TRAINRESULT "))
    return dict(json.loads(line[len("TRAINRESULT ") :]))


def test_trainer_fits_on_two_nodes_and_resumes(cluster_factory: Any, tmp_path: Path) -> None:
    cluster = cluster_factory(2)
    project = tmp_path / "project"
    project.mkdir()
    script = project / "train_app.py"
    script.write_text(SCRIPT)
    first = run_script(script, cluster.server.url, str(free_port()))
    assert first["result"] == {"world_size": 4, "num_nodes": 2, "resumed": False}
    losses = [m["loss"] for m in first["metrics"]]
    assert [m["epoch"] for m in first["metrics"]] == list(range(15))
    assert losses[-1] < losses[0] / 2
    checkpoint = first["checkpoint"]
    # Rank 0 runs on node 0, so its checkpoint is the top of the job's outputs.
    assert checkpoint == f"job:{first['job_id']}/checkpoint"
    second = run_script(script, cluster.server.url, str(free_port()), checkpoint)
    assert second["result"]["resumed"] is True
    # Resumed from a trained model, the first loss is already below the fresh run's first.
    assert second["metrics"][0]["loss"] < losses[0] / 2
