"""Which jobs a listing shows: by state, by labels, by the schedule that made them.

The dashboard's jobs page, `GET /v1/jobs` and `gpulayer ls` read the same filters; each names
its own field (`state`, `--state`) in the one-line error for a bad value.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from gpulayer.errors import UsageError
from gpulayer.schedules.model import SCHEDULE_LABEL

JOB_STATES = ("queued", "provisioning", "running", "succeeded", "failed", "cancelled")


def check_states(values: Iterable[str], name: str) -> list[str]:
    """The states as given; a UsageError naming the field and the closest state otherwise."""
    states = [value.strip() for value in values]
    for state in states:
        if state not in JOB_STATES:
            close = difflib.get_close_matches(state, JOB_STATES, n=1)
            hint = f"did you mean {close[0]}?" if close else f"one of {', '.join(JOB_STATES)}"
            raise UsageError(f"{name}: {state!r} is not a job state; {hint}")
    return list(dict.fromkeys(states))


def parse_label_pairs(pairs: Iterable[str], name: str) -> dict[str, str]:
    """KEY=VALUE pairs into a dict; a UsageError naming the field for anything else."""
    labels: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{name}: expected KEY=VALUE, got {pair!r}")
        labels[key.strip()] = value.strip()
    return labels


def with_schedule(labels: dict[str, str], schedule: str | None, name: str) -> dict[str, str]:
    """The labels a schedule's runs carry, added to the given ones."""
    if schedule is None:
        return labels
    if not schedule.strip():
        raise UsageError(f"{name}: give a schedule's name")
    return {**labels, SCHEDULE_LABEL: schedule.strip()}
