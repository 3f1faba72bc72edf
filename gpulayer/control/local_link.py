"""The in-process door between the embedded control plane and its local worker."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpulayer.control.claim_poll import claim_blocking
from gpulayer.control.service import ControlService
from gpulayer.protocol.messages import (
    AttemptReport,
    ClaimReply,
    FinishOutcome,
    HeartbeatReply,
    Registration,
    split_job_reference,
)


class LocalLink:
    def __init__(self, service: ControlService) -> None:
        self.service = service

    def register(self, registration: Registration) -> str:
        return self.service.workers.register_worker(registration)[0].id

    def heartbeat(
        self, worker_id: str, running: list[int], degraded: str | None = None
    ) -> HeartbeatReply:
        return self.service.workers.heartbeat(worker_id, running=running, degraded=degraded)

    def leave(self, worker_id: str) -> None:
        self.service.workers.leave(worker_id)

    def claim(self, worker_id: str, wait: float) -> ClaimReply:
        # The path and rules a remote worker's claim takes (its life's epoch, cancels too).
        return claim_blocking(self.service.claims, worker_id, wait, with_cancels=True)

    def append_logs(self, attempt_id: int, lines: list[tuple[str, str]]) -> None:
        self.service.reports.append_logs(attempt_id, lines)

    def finish(self, attempt_id: int, report: AttemptReport) -> None:
        self.service.reports.finish_attempt(attempt_id, report)

    def finish_many(
        self, worker_id: str, reports: Sequence[tuple[int, AttemptReport]]
    ) -> list[FinishOutcome]:
        return self.service.reports.finish_attempts(worker_id, reports)

    def fetch_bundle(self, job_id: str, destination: Path) -> None:
        shutil.copyfile(self.service.jobs.bundle_path(job_id), destination)

    def store_outputs(self, attempt_id: int, files: list[tuple[str, Path]]) -> None:
        self.service.outputs.record_outputs(attempt_id, files)

    def resolve_artifact(self, reference: str, scratch: Path) -> Path:
        return resolve_job_artifact(self.service, reference)

    def job_environment(self, job_id: str) -> Mapping[str, str] | None:
        return self.service.environments.job_environment(job_id)


def resolve_job_artifact(service: ControlService, reference: str) -> Path:
    """`job:<id>/<path>`: an earlier job's output file or directory."""
    job_ref, path = split_job_reference(reference)
    job_id = service.jobs.resolve_job_id(job_ref)
    if not path:
        return service.layout.outputs_dir(job_id)
    return service.jobs.artifact_path(job_id, path)
