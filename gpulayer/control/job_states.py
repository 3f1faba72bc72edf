"""The one place where jobs and attempts change state, through tables of allowed moves.

Every move is a conditional UPDATE from the states the table allows into the target, so two
control planes (or two threads) racing to move the same record cannot both win, and a move the
table forbids (a finished job going back to the queue) can never happen, whoever asks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from gpulayer.control.record_states import sources
from gpulayer.control.store import (
    TERMINAL_STATES,
    AttemptEnd,
    EndRecorded,
    EndRule,
    Store,
)

__all__ = [
    "ACTIVE_ATTEMPT_STATES",
    "ATTEMPT_TRANSITIONS",
    "JOB_TRANSITIONS",
    "JobStates",
    "sources",
]

JOB_TRANSITIONS: dict[str, frozenset[str]] = {
    "queued": frozenset({"provisioning", "running", "failed", "cancelled"}),
    "provisioning": frozenset({"queued", "running", "failed", "cancelled"}),
    # Back to queued: a lost or preempted attempt that may be retried.
    "running": frozenset({"queued", "succeeded", "failed", "cancelled"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}

ATTEMPT_TRANSITIONS: dict[str, frozenset[str]] = {
    "assigned": frozenset({"running", "failed", "cancelled"}),
    "running": frozenset({"succeeded", "failed", "cancelled"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}

ACTIVE_ATTEMPT_STATES = ("assigned", "running")


class JobStates:
    def __init__(
        self, store: Store, *, on_queue_change: Callable[[str, bool], None] | None = None
    ) -> None:
        self.store = store
        self._on_queue_change = on_queue_change
        """Told (job id, whether it entered the queue) of every move into or out of it."""

    def move_job(
        self, job_id: str, to: str, *, only_from: list[str] | None = None, **values: Any
    ) -> bool:
        """Move a job into ``to`` if the table (and ``only_from``, when given) allows it from
        where it is. True if this call moved it. A job that ends takes its attempts along."""
        allowed = sources(JOB_TRANSITIONS, to)
        if only_from is not None:
            allowed = [s for s in allowed if s in only_from]
        if to in TERMINAL_STATES:
            values.setdefault("finished_at", time.time())
        won = self.store.update_job(job_id, expect_states=allowed, state=to, **values)
        if won and self._on_queue_change is not None and "queued" in (to, *allowed):
            self._on_queue_change(job_id, to == "queued")
        if won and to in TERMINAL_STATES:
            self._end_attempts(job_id, to, values.get("reason"))
        return won

    def move_attempt(self, attempt_id: int, to: str, **values: Any) -> bool:
        if to in TERMINAL_STATES:
            values.setdefault("finished_at", time.time())
        return self.store.update_attempt(
            attempt_id, expect_states=sources(ATTEMPT_TRANSITIONS, to), state=to, **values
        )

    def start_attempts(self, attempt_ids: list[int], started_at: float) -> set[int]:
        """Several attempts to running in one write, each only from where the table allows;
        the ids this call moved."""
        return self.store.update_attempts(
            attempt_ids,
            expect_states=sources(ATTEMPT_TRANSITIONS, "running"),
            state="running",
            started_at=started_at,
        )

    def end_reported(self, ends: Sequence[AttemptEnd]) -> list[EndRecorded]:
        """Attempts of jobs of one node ending as their worker reported, each attempt with its
        job (only from running), all in one write: what move_attempt then move_job did for
        each, with the same tables."""
        return self.store.end_attempts(ends, _END_RULES)

    def _end_attempts(self, job_id: str, job_state: str, reason: str | None) -> None:
        """An attempt never stays live under an ended job (its worker is then fenced)."""
        state = _others_end(job_state)
        for attempt in self.store.attempts_for(job_id):
            if attempt.state in ACTIVE_ATTEMPT_STATES:
                self.move_attempt(attempt.id, state, reason=reason or "job_ended")


def _others_end(job_state: str) -> str:
    """The state a job's live attempts end in when the job ends in ``job_state``."""
    return "cancelled" if job_state == "cancelled" else "failed"


def _end_rule(to: str) -> EndRule:
    others = _others_end(to)
    return EndRule(
        attempt_from=sources(ATTEMPT_TRANSITIONS, to),
        job_from=[s for s in sources(JOB_TRANSITIONS, to) if s == "running"],
        others_to=others,
        others_from=sources(ATTEMPT_TRANSITIONS, others),
    )


_END_RULES = {to: _end_rule(to) for to in TERMINAL_STATES}
