"""What placement answers: a worker and its GPUs, or why no worker takes the job."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    worker_id: str
    gpu_indices: tuple[int, ...] = ()


@dataclass(frozen=True)
class Explanation:
    """Per worker id, why it cannot take the job now and why it could never run it.

    An empty list means it can (now) or could (ever).
    """

    now: Mapping[str, list[str]]
    never: Mapping[str, list[str]]

    @property
    def fits_now(self) -> list[str]:
        return sorted(worker_id for worker_id, reasons in self.now.items() if not reasons)

    @property
    def could_ever_run(self) -> bool:
        return any(not reasons for reasons in self.never.values())

    def summary(self) -> list[tuple[str, int]]:
        """Each reason with how many workers gave it, most common first."""
        counts = Counter(reason for reasons in self.now.values() for reason in reasons)
        return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


@dataclass(frozen=True)
class Unplaced:
    reasons: Mapping[str, list[str]]
    """Worker id -> why that worker cannot take the job now."""
    never: bool
    """True when no worker could ever run the job, whatever it were running."""
