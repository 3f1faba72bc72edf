"""Distributed workloads on one node: torchrun with gloo on CPU, real ranks."""

from __future__ import annotations

import importlib.util
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from gpulayer.spec import DistributedWorkload, JobSpec
from gpulayer.worker.distributed import MultiNodeNotSupportedError, launch_argv
from gpulayer.worker.runner import FUNCTION_SHIM, JobRun, RunContext, RunOutcome

needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="needs torch (pip install torch==2.13.0)"
)

SCRIPT = r"""
import os, pathlib, sys
import torch
import torch.distributed as dist

dist.init_process_group(os.environ["GPULAYER_COMM_BACKEND"])
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
# One write per line: the ranks share one pipe, and print() writes the newline separately.
sys.stdout.write(f"rank {rank} of {world} sum {t.item():g} args {sys.argv[1:]}\n")
if rank == 0:
    (pathlib.Path(os.environ["GPULAYER_OUTPUT_DIR"]) / "done").write_text("ok")
dist.destroy_process_group()
# Leave before the interpreter's teardown, where torch 2.13's gloo can abort a finished rank.
sys.stdout.flush()
os._exit(0)
"""

FUNCTIONS = r"""
import os, sys, time
import torch
import torch.distributed as dist

def reduce(scale, *, offset=0):
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "world": dist.get_world_size(),
            "value": t.item() * scale + offset}

def fail_on_rank_one():
    # Both ranks meet first: rank 0 returning at once could leave before rank 1's gloo mesh
    # is up, failing rank 1 in its init rather than in its own code (seen under load).
    dist.barrier()
    if dist.get_rank() == 1:
        raise ValueError("rank one gives up")
    return "rank zero is fine"

def hang():
    sys.stdout.write(f"pid {os.getpid()}\nready\n")
    time.sleep(300)
"""


class Logs:
    def __init__(self) -> None:
        self.chunks: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def __call__(self, stream: str, text: str) -> None:
        with self.lock:
            self.chunks.append((stream, text))

    def text(self, stream: str | None = None) -> str:
        return "".join(t for s, t in self.chunks if stream in (None, s))


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(textwrap.dedent(SCRIPT))
    (src / "ranks.py").write_text(textwrap.dedent(FUNCTIONS))
    return src


def spec(**workload: Any) -> JobSpec:
    return JobSpec.model_validate({"workload": {"kind": "distributed", **workload}})


def start(job_spec: JobSpec, source: Path, logs: Logs) -> JobRun:
    return JobRun(
        RunContext("job-1", 1, job_spec, source.parent / "attempt", source_dir=source), logs
    )


def run(job_spec: JobSpec, source: Path, logs: Logs) -> RunOutcome:
    return start(job_spec, source, logs).run()


def test_more_than_one_node_needs_a_multi_node_launcher(tmp_path: Path) -> None:
    workload = spec(entrypoint="train.py", num_workers=2).workload
    assert isinstance(workload, DistributedWorkload)
    with pytest.raises(MultiNodeNotSupportedError, match="multi-node launcher"):
        launch_argv(workload, python="python", function_shim=FUNCTION_SHIM)
    logs = Logs()
    outcome = run(spec(entrypoint="train.py", num_workers=2), tmp_path, logs)
    assert (outcome.state, outcome.reason) == ("failed", "setup_failed")
    assert "workload.num_workers: 2 nodes need a multi-node launcher" in (outcome.message or "")


def test_launch_line() -> None:
    workload = spec(entrypoint="train.py", args=["--lr", "0.1"], procs_per_worker=4).workload
    assert isinstance(workload, DistributedWorkload)
    argv = launch_argv(workload, python="/opt/py", function_shim=FUNCTION_SHIM)
    assert argv[:3] == ["/opt/py", "-m", "torch.distributed.run"]
    assert "--nnodes=1" in argv and "--nproc-per-node=4" in argv and "--max-restarts=0" in argv
    assert argv[-3:] == ["train.py", "--lr", "0.1"]


@needs_torch
@pytest.mark.slow
def test_script_runs_in_every_rank(source: Path) -> None:
    logs = Logs()
    outcome = run(spec(entrypoint="train.py", args=["--x", "1"], procs_per_worker=2), source, logs)
    assert outcome.state == "succeeded", logs.text()
    stdout = logs.text("stdout")
    assert "rank 0 of 2 sum 3 args ['--x', '1']\n" in stdout
    assert "rank 1 of 2 sum 3 args ['--x', '1']\n" in stdout
    assert (outcome.output_dir / "done").read_text() == "ok"


@needs_torch
@pytest.mark.slow
def test_function_returns_rank_zeros_value(source: Path) -> None:
    logs = Logs()
    job = spec(
        function="ranks:reduce",
        function_args=[10],
        function_kwargs={"offset": 1},
        procs_per_worker=2,
    )
    outcome = run(job, source, logs)
    assert outcome.state == "succeeded", logs.text()
    assert outcome.result == {"rank": 0, "world": 2, "value": 31.0}


@needs_torch
@pytest.mark.slow
def test_failing_rank_is_named(source: Path) -> None:
    logs = Logs()
    outcome = run(spec(function="ranks:fail_on_rank_one", procs_per_worker=2), source, logs)
    assert (outcome.state, outcome.reason) == ("failed", "function_error")
    assert outcome.message == "rank 1: ValueError: rank one gives up"
    assert "ValueError: rank one gives up" in logs.text("stderr")


@needs_torch
@pytest.mark.slow
def test_cancel_ends_ranks_in_sessions_of_their_own(source: Path) -> None:
    # torchrun starts each rank in a new session, out of reach of a process group kill.
    jobs: list[JobRun] = []

    class CancelWhenReady(Logs):
        def __call__(self, stream: str, text: str) -> None:
            super().__call__(stream, text)
            if self.text("stdout").count("ready") == 2:
                jobs[0].cancel()

    logs = CancelWhenReady()
    job = start(spec(function="ranks:hang", procs_per_worker=2), source, logs)
    jobs.append(job)
    outcome = job.run()
    assert outcome.state == "cancelled"
    pids = [
        int(line.split()[1]) for line in logs.text("stdout").splitlines() if line.startswith("pid")
    ]
    assert len(pids) == 2
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        assert state in ("Z", "X")


TRAIN_FN = r"""
import time
import gpulayer as gl

def train_fn(config):
    folder = gl.train.checkpoint_dir()
    for step in range(1000):
        with open(folder / "model.bin", "w") as f:
            f.write(f"step {step} begins\n")
            f.flush()
            if step == 1:
                print("saving", flush=True)
                time.sleep(config["slow_save"])  # a save that takes a while
            f.write(f"step {step} ends\n")
        gl.train.report({"step": step})
"""


@needs_torch
@pytest.mark.slow
def test_a_trainer_cancelled_mid_save_finishes_the_save_and_stops_at_its_report(
    source: Path,
) -> None:
    (source / "ckpt.py").write_text(TRAIN_FN)
    jobs: list[JobRun] = []

    class CancelWhileSaving(Logs):
        def __call__(self, stream: str, text: str) -> None:
            super().__call__(stream, text)
            if "saving" in text:
                jobs[0].cancel()

    logs = CancelWhileSaving()
    job_spec = spec(
        function="gpulayer.sdk.train:run",
        function_args=["ckpt:train_fn", {"slow_save": 3}],
        procs_per_worker=1,
    )
    job = start(job_spec, source, logs)
    jobs.append(job)
    outcome = job.run()
    assert outcome.state == "cancelled", logs.text()
    saved = (outcome.output_dir / "checkpoint" / "model.bin").read_text()
    assert saved == "step 1 begins\nstep 1 ends\n", logs.text()
    assert 'gpulayer.train.report {"step": 1}' in logs.text("stdout")
    assert '"step": 2' not in logs.text("stdout")
