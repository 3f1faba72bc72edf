"""How a worker's attempt gets back to its control plane: the link the agent talks through,
the upload of its outputs and the report of its end, each retried while the control plane
is away. Apart from the agent (which decides when) so each piece reads alone."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from gpulayer.backoff import WORKER_CLAIM, WORKER_OUTPUTS, WORKER_REPORT
from gpulayer.errors import ForbiddenError, StaleAttemptError, UsageError
from gpulayer.protocol.client import Unauthorized
from gpulayer.protocol.messages import (
    Assignment,
    AttemptReport,
    ClaimReply,
    FinishOutcome,
    HeartbeatReply,
    Registration,
)
from gpulayer.worker.finish_batch import FinishBatcher
from gpulayer.worker.logship import LogShipper
from gpulayer.worker.outputs import gather_outputs

if TYPE_CHECKING:
    import tenacity

log = logging.getLogger("gpulayer.worker")


class ControlLink(Protocol):
    def register(self, registration: Registration) -> str: ...
    def heartbeat(
        self, worker_id: str, running: list[int], degraded: str | None = None
    ) -> HeartbeatReply: ...
    def leave(self, worker_id: str) -> None: ...
    def claim(self, worker_id: str, wait: float) -> ClaimReply: ...
    def append_logs(self, attempt_id: int, lines: list[tuple[str, str]]) -> None: ...
    def finish(self, attempt_id: int, report: AttemptReport) -> None: ...
    def finish_many(
        self, worker_id: str, reports: Sequence[tuple[int, AttemptReport]]
    ) -> list[FinishOutcome]: ...
    def fetch_bundle(self, job_id: str, destination: Path) -> None: ...
    def store_outputs(self, attempt_id: int, files: list[tuple[str, Path]]) -> None: ...
    def resolve_artifact(self, reference: str, scratch: Path) -> Path: ...
    def job_environment(self, job_id: str) -> Mapping[str, str] | None: ...


def refuses_worker(exc: BaseException) -> bool:
    """The control plane's word that this worker's credential is no good (not a hiccup)."""
    return isinstance(exc, (Unauthorized, ForbiddenError))


def noted(what: str) -> Callable[[tenacity.RetryCallState], None]:
    """A before-sleep hook that logs the failure a retry follows."""

    def note(state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        log.warning("%s (%s); retrying", what, error)

    return note


def store_outputs(
    link: ControlLink,
    assignment: Assignment,
    output_dir: Path,
    shipper: LogShipper,
    *,
    max_file_bytes: int,
    abandon: threading.Event,
    cancelled: Callable[[], bool],
    refused: Callable[[BaseException], None],
    fence: Callable[[int, object], None],
) -> None:
    """Upload the attempt's regular files, retried for a while; cancel and fencing win."""
    attempt_id = assignment.attempt_id
    found = gather_outputs(output_dir, max_file_bytes=max_file_bytes)
    for line in found.skipped:
        shipper.add("system", f"outputs: skipped {line}\n")
    if not found.files and assignment.attempt == 1:
        return  # nothing to keep and no earlier attempt's outputs to replace: no request
    try:
        for attempt in WORKER_OUTPUTS.retrying(
            stop_event=abandon,
            before_sleep=noted(f"storing outputs of attempt {attempt_id} failed"),
        ):
            with attempt:
                if abandon.is_set():
                    return
                try:
                    link.store_outputs(attempt_id, found.files)
                    return
                except Unauthorized as exc:
                    refused(exc)
                    return
                except (StaleAttemptError, ForbiddenError) as exc:
                    fence(attempt_id, exc)
                    return
                except UsageError as exc:  # refused for good (an archive it will not take)
                    shipper.add("system", f"outputs: refused ({exc})\n")
                    return
                except Exception as exc:
                    if cancelled():
                        shipper.add("system", f"outputs: not stored ({exc})\n")
                        return
                    raise
    except Exception as exc:  # out of time, or the worker gave up on its attempts
        if not abandon.is_set():
            shipper.add("system", f"outputs: not stored ({exc})\n")


def send_report(
    finishes: FinishBatcher,
    attempt_id: int,
    report: AttemptReport,
    *,
    abandon: threading.Event,
    refused: Callable[[BaseException], None],
) -> None:
    """Retry until the report lands, waiting out a control plane that is away; a report the
    control plane refuses as stale is dropped (the job has moved on)."""
    if abandon.is_set():
        return
    try:  # the report that lands at once (nearly every one) makes no retry policy
        _report(finishes, attempt_id, report, refused)
        return
    except Exception as exc:
        log.warning("reporting attempt %s failed (%s); retrying", attempt_id, exc)
    try:
        for attempt in WORKER_REPORT.retrying(
            stop_event=abandon,
            before_sleep=noted(f"reporting attempt {attempt_id} failed"),
        ):
            with attempt:
                if abandon.is_set():
                    return
                _report(finishes, attempt_id, report, refused)
                return
    except Exception:
        return  # the worker gave up on its attempts (drain ran out)


def _report(
    finishes: FinishBatcher,
    attempt_id: int,
    report: AttemptReport,
    refused: Callable[[BaseException], None],
) -> None:
    """One try at the report; what is not a hiccup (a refusal, an outcome) ends here."""
    try:
        outcome = finishes.finish(attempt_id, report)
    except Unauthorized as exc:
        refused(exc)
        return
    except ForbiddenError as exc:  # the request itself: a stale report is an outcome
        log.warning("attempt %s: report refused (%s)", attempt_id, exc)
        return
    if outcome.outcome != "recorded":
        log.warning("attempt %s: report %s (%s)", attempt_id, outcome.outcome, outcome.detail)


def claim_retrying(claim: Callable[[], None], stop: threading.Event) -> None:
    """One claim, tried again while the control plane is away (a refusal of the worker's
    credential passes on at once). A claim that succeeds at once, as nearly every one does,
    makes no retry policy: the local worker claims once per item of a map."""
    try:
        claim()
        return
    except Exception as exc:
        if refuses_worker(exc):
            raise
        log.warning("claiming work failed (%s); retrying", exc)
    for attempt in WORKER_CLAIM.retrying(
        stop_event=stop,
        retry_if=lambda exc: not refuses_worker(exc),
        before_sleep=noted("claiming work failed"),
    ):
        with attempt:  # a control plane hiccup must not end the worker
            if not stop.is_set():
                claim()
