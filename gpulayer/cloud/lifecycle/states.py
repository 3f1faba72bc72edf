"""The states of a rented instance, the moves allowed between them, and how long each may last.

Pure: the reconciler asks this table before every move and records each one (time, reason) in
the instance's history, so a restarted controller knows where every instance was and what is
left to do. Modelled on Ray autoscaler v2's instance states, cut to what one job needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from gpulayer.errors import GpulayerError

InstanceState = Literal[
    "requested",  # written down before any cloud call; nothing exists yet
    "launching",  # the provider's launch call is (or may have been) made
    "booting",  # the provider has it; waiting for SSH to answer
    "bootstrapping",  # installing and starting the worker over SSH
    "ready",  # the worker joined; reserved for its job, which is about to be dispatched
    "in_use",  # the job's attempt runs on its worker
    "idle",  # its job ended; the worker runs on, reserved for no job, until idle_seconds pass
    "draining",  # the job ended: closing the tunnel, taking the worker off
    "terminating",  # the provider's terminate call, retried until the provider confirms
    "terminated",  # gone, as the provider confirmed
    "never_launched",  # the provider refused the launch: nothing was created
    # A ledger entry: the job's share of a warm machine another job took (the machine goes on
    # as that job's record); written so, never moved into.
    "handed_over",
]

STATES: tuple[InstanceState, ...] = (
    "requested",
    "launching",
    "booting",
    "bootstrapping",
    "ready",
    "in_use",
    "idle",
    "draining",
    "terminating",
    "terminated",
    "never_launched",
    "handed_over",
)

GONE: frozenset[str] = frozenset({"terminated", "never_launched", "handed_over"})
"""Nothing is left in the cloud for this record (a handed-over one: its machine is another
record's now); the record stays as the ledger."""

HOLDS_WORKER: frozenset[str] = frozenset({"ready", "in_use", "idle"})
"""States in which a worker runs on the instance and needs its SSH tunnel."""

_ENDING: tuple[InstanceState, ...] = ("draining", "terminating")

TRANSITIONS: dict[str, frozenset[str]] = {
    "requested": frozenset({"launching", "never_launched", "terminating"}),
    # A launch that failed without saying whether it created something must be looked up.
    "launching": frozenset({"booting", "never_launched", "terminating"}),
    "booting": frozenset({"bootstrapping", *_ENDING}),
    # A controller restart mid-bootstrap goes back to waiting for SSH and starts over.
    "bootstrapping": frozenset({"booting", "ready", *_ENDING}),
    "ready": frozenset({"in_use", "idle", *_ENDING}),
    "in_use": frozenset({"idle", *_ENDING}),
    # A warm machine: the next job it fits takes it (back to ready, its worker kept), or its
    # idle_seconds pass and it drains.
    "idle": frozenset({"ready", *_ENDING}),
    "draining": frozenset({"terminating"}),
    "terminating": frozenset({"terminated"}),
    "terminated": frozenset(),
    "never_launched": frozenset(),
    "handed_over": frozenset(),
}

MAX_IDLE_SECONDS = 86_400.0
"""The longest idle_seconds a setting may ask for: a forgotten warm machine bills a day at most."""

# How long an instance may stay in a state before the reconciler gives up on it. None: as long
# as needed (a running job, a terminate the reaper keeps retrying). Provisioning states are also
# bounded by the job's provisioning_timeout_seconds, whichever comes first.
STATE_TIMEOUTS: dict[str, float | None] = {
    "requested": 60.0,
    "launching": 900.0,
    "booting": 900.0,
    "bootstrapping": 900.0,
    "ready": 300.0,
    "in_use": None,
    # The most any idle_seconds may keep a machine idle; each instance's own limit is its
    # provider's idle_seconds (see idle_limit).
    "idle": MAX_IDLE_SECONDS,
    "draining": 120.0,
    "terminating": None,
    "terminated": None,
    "never_launched": None,
    "handed_over": None,
}


class TransitionError(GpulayerError):
    """A move the state table does not allow (a bug, or two controllers on one record)."""


def check_transition(current: str, wanted: str) -> None:
    if current not in TRANSITIONS:
        raise TransitionError(f"unknown instance state {current!r}")
    if wanted not in TRANSITIONS[current]:
        allowed = ", ".join(sorted(TRANSITIONS[current])) or "none (final)"
        raise TransitionError(
            f"instance cannot move from {current} to {wanted} (allowed: {allowed})"
        )


def allowed(current: str, wanted: str) -> bool:
    return wanted in TRANSITIONS.get(current, frozenset())


def timed_out(state: str, since: float, now: float) -> bool:
    limit = STATE_TIMEOUTS.get(state)
    return limit is not None and now - since > limit


# What the stuck-instance pass does with an instance that outstayed its state's limit, and
# what it says. A launch whose call may have created something is terminated (the reaper
# catches one created after that); a machine that never became a worker is drained.
# `ready` is not here: a gang's ready nodes wait for the others, so the reconciler bounds it
# itself once all are ready.
_STUCK: dict[str, tuple[InstanceState, str, bool]] = {
    "requested": ("never_launched", "the launch did not start", False),
    "launching": ("terminating", "the launch call", True),
    "booting": ("draining", "the wait for SSH", True),
    "bootstrapping": ("draining", "the bootstrap", True),
    "draining": ("terminating", "draining", False),
    "idle": ("draining", "idle", False),
}

STUCK_STATES: frozenset[str] = frozenset(_STUCK)

SETTABLE_LIMITS: frozenset[str] = STUCK_STATES - {"idle"}
"""States whose limit state_timeouts may change (idle's is idle_seconds)."""

PROVISIONING_STATES: frozenset[str] = frozenset({"launching", "booting", "bootstrapping"})
"""States a job's own provisioning_timeout_seconds may hold an instance in beyond the table."""


def idle_limit(idle_seconds: float) -> float | None:
    """How long an instance whose provider keeps machines ``idle_seconds`` stays idle: that,
    within the table's limit for idle (None: the table sets none)."""
    table = STATE_TIMEOUTS["idle"]
    return None if table is None else min(table, idle_seconds)


@dataclass(frozen=True)
class StuckMove:
    to: InstanceState
    reason: str
    """As recorded with the move: `the bootstrap timed out after 300 s`."""
    failed_try: bool
    """Whether the offer counts as failed for the job (it is not tried again for it)."""


def stuck_move(
    state: str, since: float, now: float, limits: Mapping[str, float | None] = STATE_TIMEOUTS
) -> StuckMove | None:
    """The move for an instance in ``state`` since ``since``, when it has outstayed the limit."""
    if state not in _STUCK:
        return None
    limit = limits.get(state, STATE_TIMEOUTS[state])
    if limit is None or now - since <= limit:
        return None
    to, what, failed_try = _STUCK[state]
    check_transition(state, to)
    return StuckMove(to, f"{what} timed out after {limit:g} s", failed_try)
