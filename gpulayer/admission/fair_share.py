"""Fair share: each team's dominant share of GPUs, CPU and spend over a decaying window.

Usage is charged in GPU-seconds, CPU-seconds and spend; each charge halves in weight every
``half_life`` seconds (Slurm's fair-share decay), so last month weighs little and the last
hour a lot. A team's share of a resource is its decayed usage over every team's; its dominant
share is the largest of the three, divided by its weight (dominant resource fairness, as
Kueue's fair sharing). The team with the smallest dominant share is served first.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

SHARE_RESOURCES = ("gpu_seconds", "cpu_seconds", "spend_micros")
DEFAULT_HALF_LIFE = 7 * 24 * 3600.0


@dataclass(frozen=True)
class UsageCharge:
    team: str
    at: float
    """When the usage was had: a finished run's end, or now for a running one so far."""
    gpu_seconds: float = 0.0
    cpu_seconds: float = 0.0
    spend_micros: float = 0.0


class ShareLedger:
    """Decayed usage per team, as of one moment; grown within a pass by what it admits."""

    def __init__(
        self,
        charges: Iterable[UsageCharge] = (),
        *,
        now: float,
        half_life: float = DEFAULT_HALF_LIFE,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        if half_life <= 0:
            raise ValueError("half_life must be positive")
        self.now = now
        self.half_life = half_life
        self._weights = dict(weights or {})
        self._usage: defaultdict[str, dict[str, float]] = defaultdict(
            lambda: dict.fromkeys(SHARE_RESOURCES, 0.0)
        )
        self._totals = dict.fromkeys(SHARE_RESOURCES, 0.0)
        for charge in charges:
            self.charge(charge)

    def charge(self, charge: UsageCharge) -> None:
        # A charge from the future (a clock ahead of ours) counts at full weight, no more.
        factor = 0.5 ** (max(0.0, self.now - charge.at) / self.half_life)
        usage = self._usage[charge.team]
        for resource in SHARE_RESOURCES:
            amount = float(getattr(charge, resource)) * factor
            usage[resource] += amount
            self._totals[resource] += amount

    def copy(self) -> ShareLedger:
        other = ShareLedger(now=self.now, half_life=self.half_life, weights=self._weights)
        for team, usage in self._usage.items():
            other._usage[team] = dict(usage)
        other._totals = dict(self._totals)
        return other

    def usage(self, team: str) -> Mapping[str, float]:
        if team not in self._usage:
            return dict.fromkeys(SHARE_RESOURCES, 0.0)
        return dict(self._usage[team])

    def share(self, team: str) -> float:
        return dominant_share(self.usage(team), self._totals, self._weights.get(team, 1.0))


def dominant_share(
    usage: Mapping[str, float], totals: Mapping[str, float], weight: float = 1.0
) -> float:
    """The largest of a team's shares of each resource, over its weight; 0 with no usage."""
    if weight <= 0:
        raise ValueError("weight must be positive")
    largest = 0.0
    for resource, total in totals.items():
        if total > 0:
            largest = max(largest, usage.get(resource, 0.0) / total)
    return largest / weight
