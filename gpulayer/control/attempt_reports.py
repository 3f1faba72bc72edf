"""What workers report of the attempts they run: log lines and ends, each accepted only from
the attempt's worker while the attempt is still its job's current one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpulayer.control.attempt_ends import RETRYABLE_REASONS, AttemptEnds
from gpulayer.control.auth import Principal
from gpulayer.control.changes import ChangeFeed
from gpulayer.control.dispatch import LivePlacement
from gpulayer.control.dispatcher import Dispatcher
from gpulayer.control.gang_service import GangService
from gpulayer.control.job_states import JobStates
from gpulayer.control.store import TERMINAL_STATES, AttemptEnd, AttemptRecord, Store
from gpulayer.control.submit_environments import SubmitEnvironments
from gpulayer.control.text_checks import repair_text
from gpulayer.control.worker_access import WorkerAccess
from gpulayer.errors import ForbiddenError, NotFoundError, StaleAttemptError
from gpulayer.protocol.messages import AttemptReport, FinishOutcome


class AttemptReports:
    def __init__(
        self,
        store: Store,
        states: JobStates,
        *,
        access: WorkerAccess,
        gangs: GangService,
        ends: AttemptEnds,
        placement: LivePlacement,
        environments: SubmitEnvironments,
        changes: ChangeFeed,
        dispatcher: Dispatcher,
    ) -> None:
        self.store = store
        self.states = states
        self.access = access
        self.gangs = gangs
        self.ends = ends
        self.placement = placement
        self.environments = environments
        self.changes = changes
        self.dispatcher = dispatcher

    def append_logs(
        self, attempt_id: int, lines: Sequence[tuple[str, str]], caller: Principal | None = None
    ) -> None:
        # A fenced attempt's output is not the job's.
        attempt = self.access.own_attempt(attempt_id, caller)
        node = attempt.node_rank if self.gangs.is_gang(attempt) else None
        # A job may print a NUL; no line is refused for it, it is stored repaired.
        storable = [(stream, repair_text(text)) for stream, text in lines]
        self.store.append_logs(attempt.job_id, attempt.number, storable, node=node)
        self.changes.notify()

    def finish_attempts(
        self,
        worker_id: str,
        reports: Sequence[tuple[int, AttemptReport]],
        caller: Principal | None = None,
    ) -> list[FinishOutcome]:
        """Several of one worker's attempts ending: each checked on its own, as
        ``finish_attempt`` would, those of jobs of one node ending as reported recorded in one
        write, and one dispatch pass after them all (see Dispatcher.dispatch_soon)."""
        self.access.check_worker(caller, worker_id)
        outcomes: list[FinishOutcome | None] = [None] * len(reports)
        # The jobs these ends changed, for their followers (None: perhaps others too, as a
        # gang's or a retry's end, or an end cut short).
        touched: set[str] | None = None
        try:
            plain = self._plain_ends(reports, caller, outcomes)
            if plain:
                self._record_plain_ends(plain, outcomes)
            if all(outcome is not None for outcome in outcomes):
                touched = {attempt.job_id for _, attempt, _ in plain}
            for at, (attempt_id, report) in enumerate(reports):
                if outcomes[at] is None:
                    outcomes[at] = self._finish_one(attempt_id, report, caller)
        finally:
            self.dispatcher.dispatch_soon(touched)
        return [outcome for outcome in outcomes if outcome is not None]

    def _record_plain_ends(
        self,
        plain: list[tuple[int, AttemptRecord, AttemptEnd]],
        outcomes: list[FinishOutcome | None],
    ) -> None:
        ends = [end for _, _, end in plain]
        for (at, attempt, end), done in zip(plain, self.states.end_reported(ends), strict=True):
            if not done.attempt_moved:
                outcomes[at] = FinishOutcome(
                    attempt_id=end.attempt_id,
                    outcome="stale",
                    detail=f"attempt {end.attempt_id} is no longer current",
                )
                continue
            outcomes[at] = FinishOutcome(attempt_id=end.attempt_id, outcome="recorded")
            self.placement.job_changed(attempt.job_id)
            self.placement.worker_changed(attempt.worker_id)
            if done.job_moved or self._is_terminal(attempt.job_id):
                self.environments.forget(attempt.job_id)

    def _plain_ends(
        self,
        reports: Sequence[tuple[int, AttemptReport]],
        caller: Principal | None,
        outcomes: list[FinishOutcome | None],
    ) -> list[tuple[int, AttemptRecord, AttemptEnd]]:
        """The reports that end an attempt of a job of one node as reported (no retry, no
        gang), checked as own_attempt checks, by position; a report refused or stale here
        gets its outcome now. The attempts are read in one query."""
        found = self.store.attempts_and_epochs([attempt_id for attempt_id, _ in reports])
        plain = []
        for at, (attempt_id, report) in enumerate(reports):
            entry = found.get(attempt_id)
            try:
                if entry is None:
                    raise NotFoundError(f"attempt {attempt_id} not found")
                attempt = self.access.owned(*entry, caller)
            except StaleAttemptError as exc:
                outcomes[at] = FinishOutcome(
                    attempt_id=attempt_id, outcome="stale", detail=str(exc)
                )
                continue
            except (ForbiddenError, NotFoundError) as exc:
                outcomes[at] = FinishOutcome(
                    attempt_id=attempt_id, outcome="refused", detail=str(exc)
                )
                continue
            if report.reason in RETRYABLE_REASONS or self.gangs.is_gang(attempt):
                continue
            plain.append((at, attempt, _reported_end(attempt, report)))
        return plain

    def _finish_one(
        self, attempt_id: int, report: AttemptReport, caller: Principal | None
    ) -> FinishOutcome:
        try:
            self.finish_attempt(attempt_id, report, caller, dispatch=False)
        except StaleAttemptError as exc:
            return FinishOutcome(attempt_id=attempt_id, outcome="stale", detail=str(exc))
        except (ForbiddenError, NotFoundError) as exc:
            return FinishOutcome(attempt_id=attempt_id, outcome="refused", detail=str(exc))
        return FinishOutcome(attempt_id=attempt_id, outcome="recorded")

    def finish_attempt(
        self,
        attempt_id: int,
        report: AttemptReport,
        caller: Principal | None = None,
        *,
        dispatch: bool = True,
    ) -> None:
        attempt = self.access.own_attempt(attempt_id, caller)
        gang = self.gangs.is_gang(attempt)
        if report.logs:
            node = attempt.node_rank if gang else None
            storable = [(stream, repair_text(text)) for stream, text in report.logs]
            self.store.append_logs(attempt.job_id, attempt.number, storable, node=node)
        # A gang node's result ends with it in one write: the node that ends the gang then
        # reads every result its peers kept, even when they all report at the same moment.
        kept = {"result": report.result} if gang and report.result is not None else {}
        if not self.states.move_attempt(
            attempt_id, report.state, reason=report.reason, exit_code=report.exit_code, **kept
        ):
            raise StaleAttemptError(f"attempt {attempt_id} is no longer current")
        self.placement.job_changed(attempt.job_id)  # a gang's other nodes may end with it
        if report.reason in RETRYABLE_REASONS and attempt.worker_id is not None:
            # A worker reports its attempt lost only as it stops (its machine shutting down):
            # no more work goes to it, the retry included, until it heartbeats again.
            self.store.move_worker(attempt.worker_id, "lost")
        self.placement.worker_changed(attempt.worker_id)
        ended = self._end_job(attempt, report, gang)
        # A report's state is always an end: a job this call moved there is not read back.
        if ended or self._is_terminal(attempt.job_id):
            self.environments.forget(attempt.job_id)
        if dispatch:
            self.dispatcher.dispatch()

    def _end_job(self, attempt: AttemptRecord, report: AttemptReport, gang: bool) -> bool:
        """The job's move after its attempt's end; True when this call ended the job."""
        if gang:
            self.gangs.finish_node(attempt, report)
            return False
        if report.reason in RETRYABLE_REASONS:
            self.ends.retry_or_fail(
                attempt, report.reason, report.message or report.reason, result=report.result
            )
            return False
        # A success without a word keeps the job's message (a target skipped at submit).
        keep_message = report.message is None and report.state == "succeeded"
        said: dict[str, Any] = {} if keep_message else {"message": report.message}
        return self.states.move_job(
            attempt.job_id,
            report.state,
            only_from=["running"],
            reason=report.reason,
            exit_code=report.exit_code,
            result=report.result,
            **said,
        )

    def _is_terminal(self, job_id: str) -> bool:
        return self.store.get_job(job_id).state in TERMINAL_STATES


def _reported_end(attempt: AttemptRecord, report: AttemptReport) -> AttemptEnd:
    """The end a worker reported for an attempt of a job of one node, as the store keeps it
    (its log lines repaired like any of the job's output)."""
    return AttemptEnd(
        attempt_id=attempt.id,
        job_id=attempt.job_id,
        number=attempt.number,
        state=report.state,
        reason=report.reason,
        exit_code=report.exit_code,
        result=report.result,
        message=report.message,
        # A success without a word keeps the job's message (a target skipped at submit).
        keep_message=report.message is None and report.state == "succeeded",
        logs=[(stream, repair_text(text)) for stream, text in report.logs],
    )
