"""Inside a Trainer's ``train_fn``: where this process stands, reporting metrics, checkpoints.

    def train_fn(config):
        ctx = gl.train.context()          # rank, local_rank, world_size, node_rank, device, ...
        for epoch in range(config["epochs"]):
            ...
            gl.train.report({"epoch": epoch, "loss": loss})   # rank 0's are kept, in order
        torch.save(model.state_dict(), gl.train.checkpoint_dir() / "model.pt")

Everything here reads the environment torchrun and the worker give each rank; nothing talks
to the control plane. Rank 0's reports travel back with its return value.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulayer.errors import UsageError
from gpulayer.protocol.train_reports import report_line

CHECKPOINT_FOLDER = "checkpoint"
"""Under each node's outputs; node 0's is ``job:<id>/checkpoint``."""
RESUME_FOLDER = "resume"
"""Under each node's inputs: the checkpoint a Trainer's ``resume_from`` staged."""

_reports: list[dict[str, Any]] = []
_reached_a_report = False
_stop_requested = False


@dataclass(frozen=True)
class TrainContext:
    rank: int
    local_rank: int
    world_size: int
    node_rank: int
    num_nodes: int
    device: str
    output_dir: Path
    resume_dir: Path | None
    """The checkpoint to resume from, staged on this node; None when there is none."""


def context() -> TrainContext:
    """This process's place in the training run."""
    env = os.environ
    if "GPULAYER_OUTPUT_DIR" not in env or "RANK" not in env:
        raise UsageError("gl.train.context(): only inside a Trainer's train_fn")
    local_rank = int(env.get("LOCAL_RANK", "0"))
    resume = Path(env.get("GPULAYER_INPUT_DIR", "")) / RESUME_FOLDER
    return TrainContext(
        rank=int(env["RANK"]),
        local_rank=local_rank,
        world_size=int(env.get("WORLD_SIZE", "1")),
        node_rank=int(env.get("GPULAYER_NODE_RANK", "0")),
        num_nodes=int(env.get("GPULAYER_NUM_NODES", "1")),
        device=_device(local_rank),
        output_dir=Path(env["GPULAYER_OUTPUT_DIR"]),
        resume_dir=resume if resume.exists() else None,
    )


def report(metrics: dict[str, Any]) -> None:
    """Record metrics (JSON values) for this step; rank 0's are kept in order and printed."""
    if not isinstance(metrics, dict):
        raise UsageError("gl.train.report(): metrics must be a dict")
    try:
        line = json.dumps(metrics, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"gl.train.report(): metrics must be JSON values ({exc})") from None
    global _reached_a_report
    _reached_a_report = True
    if context().rank == 0:
        _reports.append(json.loads(line))
        _keep(line)
        print(report_line(line), file=sys.stdout, flush=True)
    if _stop_requested:
        _stop_now()


def _on_stop_signal(signum: int, frame: object) -> None:
    """SIGTERM (cancel, timeout, a machine going away) waits for the next report: a step
    ends between reports, so a checkpoint being written is finished rather than cut in
    half. A function that has not reported yet has no known safe point and stops at once;
    one that never reports again is killed when the job's grace_seconds run out."""
    global _stop_requested
    if not _reached_a_report:
        _stop_now()
    _stop_requested = True


def _stop_now() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _keep(line: str) -> None:
    """Append the report where the worker reads it back however the run ends (one write, so
    a report is whole or absent)."""
    path = os.environ.get("GPULAYER_TRAIN_REPORTS")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def checkpoint_dir() -> Path:
    """Where to save checkpoints: under this node's outputs, so they come back with the job."""
    folder = context().output_dir / CHECKPOINT_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def run(entrypoint: str, config: Any) -> dict[str, Any]:
    """What each rank runs: the user's train_fn(config); rank 0 returns its value with the
    reports and the node its checkpoint lies on (node 0: the launch keeps gpulayer's node ranks)."""
    global _reached_a_report, _stop_requested
    _reports.clear()
    _reached_a_report = _stop_requested = False
    signal.signal(signal.SIGTERM, _on_stop_signal)
    value = _load(entrypoint)(config)
    ctx = context()
    return {"value": value, "metrics": list(_reports), "node_rank": ctx.node_rank}


def _load(entrypoint: str) -> Any:
    from importlib import import_module

    module_name, _, qualname = entrypoint.partition(":")
    target: Any = import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def _device(local_rank: int) -> str:
    if os.environ.get("GPULAYER_COMM_BACKEND") == "nccl":
        return f"cuda:{local_rank}"
    return "cpu"
