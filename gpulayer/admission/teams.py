"""What the queue knows of a team: its quota, budget, cohort, weight and priority ceiling."""

from __future__ import annotations

from dataclasses import dataclass

from gpulayer.admission.budgets import Budget
from gpulayer.admission.quotas import Quota

DEFAULT_PRIORITY = 50
MAX_PRIORITY = 100


@dataclass(frozen=True)
class TeamPolicy:
    name: str
    quota: Quota | None = None
    budget: Budget | None = None
    cohort: str | None = None
    """Teams of one cohort lend each other what they leave unused."""
    weight: float = 1.0
    """Its fair-share weight: a team of weight 2 is served as if it had used half as much."""
    max_priority: int = MAX_PRIORITY
    """The highest ``placement.priority`` its members may ask for; admins may go above."""

    def priority_refusal(self, priority: int, *, admin: bool) -> str | None:
        if admin or priority <= self.max_priority:
            return None
        return (
            f"placement.priority: {priority} is above team {self.name}'s max_priority "
            f"{self.max_priority}; only an admin may ask for more"
        )
