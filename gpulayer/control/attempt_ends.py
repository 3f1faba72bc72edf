"""Attempts that end without their worker's word (it went silent, restarted, or its machine
went) and lost or preempted ones: the job retries when its retry rules allow, else ends."""

from __future__ import annotations

from typing import Any

from gpulayer.control.changes import ChangeFeed
from gpulayer.control.dispatch import LivePlacement
from gpulayer.control.gang_service import GangService
from gpulayer.control.job_states import JobStates
from gpulayer.control.store import AttemptRecord, Store
from gpulayer.spec import JobSpec

RETRYABLE_REASONS = frozenset({"worker_lost", "preempted"})


class AttemptEnds:
    def __init__(
        self,
        store: Store,
        states: JobStates,
        placement: LivePlacement,
        gangs: GangService,
        changes: ChangeFeed,
    ) -> None:
        self.store = store
        self.states = states
        self.placement = placement
        self.gangs = gangs
        self.changes = changes

    def lose_attempt(self, attempt: AttemptRecord, why: str) -> None:
        if self.states.move_attempt(attempt.id, "failed", reason="worker_lost"):
            self.placement.job_changed(attempt.job_id)
            self.placement.worker_changed(attempt.worker_id)
            if self.gangs.is_gang(attempt):
                if not self.gangs.wind_down(attempt):
                    self.gangs.end_gang(attempt, "worker_lost", why)
            else:
                self.retry_or_fail(attempt, "worker_lost", why)

    def end_on_worker(self, worker_id: str, reason: str, why: str) -> None:
        """The worker's machine is gone (reclaimed, unreachable): its attempts end with
        ``reason``, and their jobs retry if their retry_on says so."""
        for attempt in self.store.active_attempts(worker_id):
            if self.states.move_attempt(attempt.id, "failed", reason=reason):
                self.placement.job_changed(attempt.job_id)
                self.retry_or_fail(attempt, reason, why)

    def retry_or_fail(
        self, attempt: AttemptRecord, reason: str, why: str, *, result: Any = None
    ) -> None:
        """A lost or preempted attempt: its job retries, or ends keeping what the attempt
        reported (``result``; else the Trainer reports its log carries, since a machine lost
        under its job never said how it ended)."""
        job = self.store.get_job(attempt.job_id)
        spec = JobSpec.model_validate(job.spec)
        retry_allowed = reason in spec.retry.retry_on and job.attempts < spec.retry.max_attempts
        if retry_allowed and not job.cancel_requested:
            self.states.move_job(job.id, "queued", only_from=["running"])
            self.changes.log_system(
                job.id, attempt.number, [f"attempt {attempt.number}: {why}; retrying"]
            )
        else:
            self.states.move_job(
                job.id,
                "cancelled" if job.cancel_requested else "failed",
                only_from=["running"],
                reason="cancelled" if job.cancel_requested else reason,
                message=why,
                result=result if result is not None else self._reports_from_log(attempt),
            )

    def _reports_from_log(self, attempt: AttemptRecord) -> dict[str, Any] | None:
        from gpulayer.protocol.train_reports import REPORT_LINE_PREFIX, reports_in_log

        lines = self.store.attempt_stdout_starting(
            attempt.job_id, attempt.number, REPORT_LINE_PREFIX
        )
        reports = reports_in_log(lines)
        return {"value": None, "metrics": reports, "node_rank": 0} if reports else None
