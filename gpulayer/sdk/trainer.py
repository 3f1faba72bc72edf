"""`gl.Trainer(train_fn, num_workers=2, procs_per_worker=1, ...)`: distributed training as
one call. ``fit(config)`` blocks and returns a :class:`TrainResult`; ``launch(config)``
returns the Job at once.

Every rank on every node calls ``train_fn(config)`` with torch.distributed set up (gloo on
CPU, NCCL on CUDA); see :mod:`gpulayer.sdk.train` for what it can ask inside. ``train_fn`` may
live in the script being run, as with ``@gl.remote``: that script's folder is the source.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpulayer.errors import UsageError
from gpulayer.protocol.messages import JOB_ARTIFACT_PREFIX, split_job_reference
from gpulayer.sdk.builders import JobBuilder, ensure_json
from gpulayer.sdk.functions import function_location
from gpulayer.sdk.job import Job, JobFailed
from gpulayer.sdk.train import CHECKPOINT_FOLDER, RESUME_FOLDER

_RUNNER = "gpulayer.sdk.train:run"
_WORKLOAD_OPTIONS = {
    "comm_backend": "comm_backend",
    "rendezvous_port": "port",
    "join_timeout_seconds": "join_timeout_seconds",
}


@dataclass(frozen=True)
class TrainResult:
    job_id: str
    result: Any
    """Rank 0's return value of train_fn."""
    metrics: list[dict[str, Any]] = field(default_factory=list)
    """Rank 0's gl.train.report() calls, in order."""
    checkpoint: str | None = None
    """``job:<id>/checkpoint`` (rank 0 runs on node 0), when rank 0 saved one."""


class Trainer:
    def __init__(
        self,
        train_fn: Callable[[Any], Any],
        *,
        num_workers: int = 1,
        procs_per_worker: int = 1,
        resume_from: str | None = None,
        server: str | None = None,
        comm_backend: str | None = None,
        rendezvous_port: int | None = None,
        join_timeout_seconds: float | None = None,
        **options: Any,
    ) -> None:
        self._entrypoint, self._source = function_location(train_fn)
        self._name = getattr(train_fn, "__name__", "train")
        self._server = server
        self._resume_from = _checkpoint_reference(resume_from)
        self._workload: dict[str, Any] = {
            "num_workers": num_workers,
            "procs_per_worker": procs_per_worker,
        }
        rendezvous = {}
        for key, value in (
            ("comm_backend", comm_backend),
            ("rendezvous_port", rendezvous_port),
            ("join_timeout_seconds", join_timeout_seconds),
        ):
            if value is None:
                continue
            if key == "comm_backend":
                self._workload["comm_backend"] = value
            else:
                rendezvous[_WORKLOAD_OPTIONS[key]] = value
        if rendezvous:
            self._workload["rendezvous"] = rendezvous
        self._options = options
        self.builder(None).spec()  # bad options fail here, naming the field

    def builder(self, config: Any) -> JobBuilder:
        ensure_json(config, "config")
        workload = {
            "kind": "distributed",
            "function": _RUNNER,
            "function_args": [self._entrypoint, config],
            "source": self._source,
            **self._workload,
        }
        builder = JobBuilder(workload).name(self._name[:63].strip("_") or "train")
        builder.override(**self._options)
        if self._resume_from is not None:
            builder.input(self._resume_from, RESUME_FOLDER)
        return builder

    def launch(self, config: Any = None) -> TrainingJob:
        """Submit the training run; returns its job at once (``.result()`` gives a
        TrainResult, as fit does)."""
        from gpulayer.sdk.launch import launch

        job = launch(self.builder(config), server=self._server)
        return TrainingJob(job.client, job.id)

    def fit(self, config: Any = None, *, timeout: float | None = None) -> TrainResult:
        """Run to the end; rank 0's return value, reports and checkpoint reference.
        Raises JobFailed (naming the node that failed) when training does not succeed."""
        return self.launch(config).result(timeout)


class TrainingJob(Job):
    """A training run's job: its result is read as a TrainResult, not the raw payload."""

    def result(self, timeout: float | None = None) -> TrainResult:
        status = self.wait(timeout)
        if status["state"] != "succeeded":
            raise JobFailed(status)
        return train_result(self.id, status.get("result"), self.artifacts())


def train_result(job_id: str, raw: Any, artifacts: list[dict[str, Any]]) -> TrainResult:
    payload = raw if isinstance(raw, dict) else {}
    node = int(payload.get("node_rank") or 0)
    folder = CHECKPOINT_FOLDER if node == 0 else f"node-{node}/{CHECKPOINT_FOLDER}"
    saved = any(a["path"].startswith(folder + "/") for a in artifacts)
    return TrainResult(
        job_id=job_id,
        result=payload.get("value"),
        metrics=list(payload.get("metrics") or []),
        checkpoint=f"{JOB_ARTIFACT_PREFIX}{job_id}/{folder}" if saved else None,
    )


def _checkpoint_reference(reference: str | None) -> str | None:
    if reference is None:
        return None
    if isinstance(reference, TrainResult):
        reference = reference.checkpoint
        if reference is None:
            raise UsageError("resume_from: that training run saved no checkpoint")
    if not isinstance(reference, str):
        raise UsageError("resume_from: a checkpoint reference such as 'job:<id>/checkpoint'")
    try:
        split_job_reference(reference)
    except UsageError:
        raise UsageError(
            f"resume_from: {reference!r} is not a checkpoint reference such as "
            "'job:<id>/checkpoint'"
        ) from None
    return reference
