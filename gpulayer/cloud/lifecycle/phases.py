"""A cloud job's phases (provision, SSH, bootstrap, run, teardown) from its instances'
transition histories. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol


class Transition(Protocol):
    to_state: str
    at: float


@dataclass(frozen=True)
class Phase:
    name: str
    started_at: float
    ended_at: float | None
    """None while the phase goes on."""

    def seconds(self, now: float) -> float:
        return max(0.0, (self.ended_at if self.ended_at is not None else now) - self.started_at)


# Which phase an instance is in while in each state; None: between phases.
PHASE_OF_STATE: dict[str, str | None] = {
    "requested": "provision",
    "launching": "provision",
    "booting": "ssh",
    "bootstrapping": "bootstrap",
    "ready": "dispatch",
    "in_use": "run",
    "idle": "idle",  # a warm machine between jobs: it bills, as a phase shows
    "draining": "teardown",
    "terminating": "teardown",
    "terminated": None,
    "never_launched": None,
    "handed_over": None,
}


def phases(history: Sequence[Transition]) -> list[Phase]:
    """Consecutive states of one phase fold into one; a restart that sends a bootstrap back to
    the SSH wait shows as a second ssh phase."""
    found: list[Phase] = []
    current: tuple[str, float] | None = None
    for entry in history:
        name = PHASE_OF_STATE.get(entry.to_state)
        if current is not None and current[0] == name:
            continue
        if current is not None:
            found.append(Phase(current[0], current[1], entry.at))
        current = (name, entry.at) if name is not None else None
    if current is not None:
        found.append(Phase(current[0], current[1], None))
    return found


def phase_rows(history: Iterable[Transition], now: float) -> list[dict[str, object]]:
    return [
        {
            "phase": p.name,
            "started_at": p.started_at,
            "ended_at": p.ended_at,
            "seconds": round(p.seconds(now), 3),
        }
        for p in phases(list(history))
    ]
