"""A gang's end as its nodes report: a failure ends the whole gang at once, success waits for
every node, a cancel or a timeout lets every node end (and upload) before the gang ends."""

from __future__ import annotations

from gpulayer.control import gangs
from gpulayer.control.changes import ChangeFeed
from gpulayer.control.job_states import JobStates
from gpulayer.control.store import AttemptRecord, JobRecord, Store
from gpulayer.protocol.messages import AttemptReport
from gpulayer.spec import JobSpec

_KNOWN_SIZES_KEPT = 100_000


class GangService:
    def __init__(self, store: Store, states: JobStates, changes: ChangeFeed) -> None:
        self.store = store
        self.states = states
        self.changes = changes
        self._sizes: dict[str, int] = {}  # a job's spec never changes once stored

    def is_gang(self, attempt: AttemptRecord) -> bool:
        size = self._sizes.get(attempt.job_id)
        if size is None:
            size = self.note_size(self.store.get_job(attempt.job_id))
        return size > 1

    def note_size(self, job: JobRecord) -> int:
        """Remember the job's node count, so its logs and outcome need not read it again."""
        size = gangs.gang_size(job)
        if len(self._sizes) > _KNOWN_SIZES_KEPT:
            self._sizes.clear()
        self._sizes[job.id] = size
        return size

    def finish_node(self, attempt: AttemptRecord, report: AttemptReport) -> None:
        """One node ended as its worker reported."""
        if self.wind_down(attempt):
            return
        if report.state == "succeeded":
            end = gangs.after_node_success(self.store.gang_of(attempt))
            if end.state is not None:
                self.states.move_job(
                    attempt.job_id, end.state, only_from=["running"], exit_code=0, result=end.result
                )
            return
        self.end_gang(attempt, report.reason or "failed", report.message or report.reason or "")

    def wind_down(self, attempt: AttemptRecord) -> bool:
        """True when the gang ends by cancel or timeout: then it ends once every node has
        reported, cancelled or failed naming the node that timed out first, with node 0's
        result (the reports a Trainer made)."""
        job = self.store.get_job(attempt.job_id)
        gang = self.store.gang_of(attempt)
        if not gangs.winding_down(gang, job.cancel_requested):
            return False
        if not gangs.all_ended(gang):
            return True
        result = gangs.leader_result(gang)
        timed_out = gangs.first_timed_out(gang)
        if job.cancel_requested or timed_out is None:
            self.states.move_job(
                job.id,
                "cancelled",
                only_from=["running"],
                reason="cancelled",
                message="cancelled",
                result=result,
            )
            return True
        limit = JobSpec.model_validate(job.spec).timeout_seconds or 0
        message = f"{gangs.node_label(self.store, timed_out)}: timed out after {limit:g} s"
        if self.states.move_job(
            job.id,
            "failed",
            only_from=["running"],
            reason="timeout",
            message=message,
            result=result,
        ):
            self.changes.log_system(job.id, attempt.number, [message])
        return True

    def end_gang(self, attempt: AttemptRecord, reason: str, why: str) -> None:
        """Fail (or cancel) the job naming the node; the other nodes' attempts end with it."""
        job = self.store.get_job(attempt.job_id)
        where = gangs.node_label(self.store, attempt)
        cancelled = job.cancel_requested
        message = "cancelled" if cancelled else f"{where}: {why}"
        if self.states.move_job(
            job.id,
            "cancelled" if cancelled else "failed",
            only_from=["running"],
            reason="cancelled" if cancelled else reason,
            message=message,
            result=gangs.leader_result(self.store.gang_of(attempt)),
        ):
            others = [a.node_rank for a in self.store.gang_of(attempt) if a.id != attempt.id]
            self.changes.log_system(
                job.id,
                attempt.number,
                [f"{message}; ending the gang's other nodes {others}"] if not cancelled else [],
            )
