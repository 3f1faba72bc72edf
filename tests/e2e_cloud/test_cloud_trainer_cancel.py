"""A Trainer run of two nodes cancelled on rented machines of their own keeps what it had:
rank 0's last checkpoint comes back as the job's artifact, its reports show in `status`, and a
new run resumes from `job:<id>/checkpoint`. The hosts have no torch: the job's setup installs
it from the package index on the test network."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.e2e_cloud.journey import last_job, ledger, wait_until
from tests.e2e_cloud.test_cloud_ssh_gang import two_hosts
from tests.support.cli import run_cli
from tests.support.package_index import PackageIndex
from tests.support.servers import free_port

pytestmark = pytest.mark.slow

ENDED = ("succeeded", "failed", "cancelled")

# The Trainer builds the job, with the setup a bare host needs (torch from the lab's index),
# and prints it for `submit -f`.
TRAIN_APP = textwrap.dedent(
    """
    import json, signal, sys, time
    import gpulayer as gl


    def train_fn(config):
        import torch
        from torch import nn

        ctx = gl.train.context()
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        start, resumed = 0, None
        if ctx.resume_dir is not None:
            saved = torch.load(ctx.resume_dir / "model.pt")
            model.load_state_dict(saved["model"])
            start, resumed = saved["epoch"] + 1, saved["how"]
        done = {"epoch": start - 1}

        def save(how):
            state = {"model": model.state_dict(), "epoch": done["epoch"], "how": how}
            torch.save(state, gl.train.checkpoint_dir() / "model.pt")

        def save_and_stop(signum, frame):
            # Cancelled: a last checkpoint, slow to write as a large model's is, in the grace
            # before the kill; node 1 has long ended by then.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(3)
            save("on_sigterm")
            sys.exit(0)

        if ctx.rank == 0:
            signal.signal(signal.SIGTERM, save_and_stop)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
        y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
        for epoch in range(start, start + config["epochs"]):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            done["epoch"] = epoch
            if ctx.rank == 0:
                save("each_epoch")
            gl.train.report({"epoch": epoch, "loss": loss.item()})
            time.sleep(config["pause"])
        return {"started_at_epoch": start, "resumed_from": resumed}


    if __name__ == "__main__":
        nodes, port, epochs, pause = map(int, sys.argv[1:5])
        index_url = sys.argv[5]
        resume = sys.argv[6] if len(sys.argv) > 6 else None
        setup = {"pip": ["torch==2.13.0"], "index_url": index_url, "timeout_seconds": 900}
        trainer = gl.Trainer(train_fn, num_workers=nodes, procs_per_worker=1, target="cloud",
                             rendezvous_port=port, resume_from=resume, timeout=900, setup=setup)
        print(json.dumps(trainer.builder({"epochs": epochs, "pause": pause}).to_dict()))
    """
)


def trainer_job(project: Path, torch: PackageIndex, *args: str) -> Path:
    """The Trainer's job for ``args`` (nodes, port, epochs, pause seconds, [resume_from]),
    with torch's setup."""
    nodes, port, epochs, pause, *resume = args
    done = subprocess.run(
        [sys.executable, "train_app.py", nodes, port, epochs, pause, torch.url, *resume],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    spec = json.loads(done.stdout)
    assert spec["setup"]["pip"] == ["torch==2.13.0"]
    path = project / f"job-{len(list(project.glob('job-*.json')))}.json"
    path.write_text(json.dumps(spec))
    return path


def reports_in_logs(job_id: str) -> list[dict[str, Any]]:
    prefix = "gpulayer.train.report "
    shown = run_cli(["logs", job_id]).stdout
    return [json.loads(line.split(prefix, 1)[1]) for line in shown.splitlines() if prefix in line]


def job_status(job_id: str) -> dict[str, Any]:
    return dict(json.loads(run_cli(["status", job_id, "--json"]).stdout))


def torn_down(job_id: str) -> None:
    wait_until(
        lambda: all(i["state"] == "terminated" for i in ledger(job_id)["instances"]),
        what="teardown",
    )


def test_a_cancelled_trainer_run_on_rented_hosts_keeps_its_checkpoint_and_reports(
    ssh_hosts: Any, cloud_home: Path, tmp_path: Path, torch_index: PackageIndex
) -> None:
    two_hosts(ssh_hosts, cloud_home, tmp_path, ("t1", "t2"))
    project = tmp_path / "project"
    project.mkdir()
    (project / "train_app.py").write_text(TRAIN_APP)

    launched = run_cli(
        [
            "submit",
            "-d",
            "-f",
            str(trainer_job(project, torch_index, "2", str(free_port()), "10000", "1")),
        ],
        cwd=project,
    )
    assert launched.returncode == 0, launched.stderr
    job_id = launched.stdout.strip().split()[-1]

    def some_reports() -> bool:
        state = job_status(job_id)["state"]
        assert state not in ENDED, run_cli(["logs", job_id]).stdout[-3000:]
        return len(reports_in_logs(job_id)) >= 4

    wait_until(some_reports, timeout=600, what="four reports")
    assert run_cli(["cancel", job_id]).returncode == 0
    wait_until(
        lambda: job_status(job_id)["state"] in ENDED,
        timeout=120,
        what="the cancel",
    )
    job = job_status(job_id)
    assert job["state"] == "cancelled", job
    torn_down(job_id)

    # Rank 0's last checkpoint came back with the job, from a host that is gone.
    listed = run_cli(["artifacts", job_id, "--json"])
    assert listed.returncode == 0, listed.stderr
    assert "checkpoint/model.pt" in {a["path"] for a in json.loads(listed.stdout)}
    # Its reports are kept, in order, as many as it made before the end.
    result = job["result"]
    assert isinstance(result, dict), job
    epochs = [m["epoch"] for m in result["metrics"]]
    assert len(epochs) >= 4 and epochs == list(range(len(epochs)))
    shown = run_cli(["status", job_id])
    assert shown.returncode == 0, shown.stderr
    assert f'"epoch": {epochs[-1]}' in shown.stdout, shown.stdout

    # A new run on a rented host resumes from the cancelled one's checkpoint.
    reference = f"job:{job_id}/checkpoint"
    resumed_file = trainer_job(project, torch_index, "1", str(free_port()), "2", "0", reference)
    resumed = run_cli(["submit", "-f", str(resumed_file)], cwd=project, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    second = last_job()
    assert second["id"] != job_id and second["state"] == "succeeded", second
    started = second["result"]["value"]["started_at_epoch"]
    # It is the checkpoint rank 0 wrote in its grace after the cancel.
    assert second["result"]["value"]["resumed_from"] == "on_sigterm", second["result"]
    # The last epoch done: the last reported, or one after (cancelled before its report).
    assert started in (epochs[-1] + 1, epochs[-1] + 2), (started, epochs)
    torn_down(second["id"])
