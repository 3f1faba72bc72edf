"""Dollar budgets per team and period, in whole micro-units so sums never drift.

Before a rented machine is launched its worst case (hourly price x nodes x the job's time
limit, or a fleet's idle limit) is reserved; at its end the reservation is settled to what the
ledger charged. A job is admitted only when the period's settled spend, every open reservation
and its own worst case together stay within the budget, so the budget is never overspent
whatever the jobs then do.
"""

from __future__ import annotations

import calendar
import math
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from enum import Enum

MICROS = 1_000_000


class Period(str, Enum):
    DAY = "day"
    WEEK = "week"
    MONTH = "month"


@dataclass(frozen=True)
class Budget:
    limit_micros: int
    period: Period
    currency: str = "USD"


@dataclass(frozen=True)
class BudgetUse:
    """A team's spend in the current period."""

    settled_micros: int = 0
    """What the ledger charged for machines that ended in the period."""
    reserved_micros: int = 0
    """Worst cases still held by machines not yet settled."""

    @property
    def committed_micros(self) -> int:
        return self.settled_micros + self.reserved_micros

    def reserve(self, micros: int) -> BudgetUse:
        return BudgetUse(self.settled_micros, self.reserved_micros + micros)


def worst_case_micros(hourly_price: float, nodes: int, seconds: float) -> int:
    """The most a machine set may cost: rounded up, so a reservation never under-holds."""
    if hourly_price < 0 or nodes < 0 or seconds < 0:
        raise ValueError("price, nodes and seconds must not be negative")
    exact = hourly_price * nodes * seconds / 3600.0 * MICROS
    # Rounded first so float noise (1.0000000002) does not add a unit; any cost holds one.
    return max(math.ceil(round(exact, 3)), 1 if exact > 0 else 0)


def budget_refusal(team: str, budget: Budget | None, use: BudgetUse, micros: int) -> str | None:
    """Why a job whose worst case is ``micros`` may not start now; None when it fits."""
    if budget is None or use.committed_micros + micros <= budget.limit_micros:
        return None
    return (
        f"budget: {money(use.committed_micros)} of {money(budget.limit_micros)} "
        f"{budget.currency} this {budget.period.value} for team {team}; "
        f"this job may cost up to {money(micros)}"
    )


def never_fits(team: str, budget: Budget | None, micros: int) -> str | None:
    """Why the job's worst case is over the whole budget, so no wait would let it start."""
    if budget is None or micros <= budget.limit_micros:
        return None
    return (
        f"budget: this job may cost up to {money(micros)} {budget.currency}, over team "
        f"{team}'s whole budget of {money(budget.limit_micros)} a {budget.period.value}"
    )


def money(micros: int) -> str:
    cents = -(-micros // 10_000)
    return f"{cents // 100}.{cents % 100:02d}"


def period_start(period: Period, now: float) -> float:
    """When the period holding ``now`` began, in UTC: midnight, Monday, the 1st."""
    moment = datetime.fromtimestamp(now, tz=timezone.utc)
    midnight = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if period is Period.DAY:
        start = midnight
    elif period is Period.WEEK:
        start = midnight - timedelta(days=midnight.weekday())
    else:
        start = midnight.replace(day=1)
    return start.timestamp()


def period_end(period: Period, now: float) -> float:
    start = datetime.fromtimestamp(period_start(period, now), tz=timezone.utc)
    if period is Period.DAY:
        end = start + timedelta(days=1)
    elif period is Period.WEEK:
        end = start + timedelta(days=7)
    else:
        days = calendar.monthrange(start.year, start.month)[1]
        end = start + timedelta(days=days)
    return end.timestamp()


def parse_budget(text: str, *, field: str = "budget") -> Budget:
    """``500/month`` -> a budget; a ValueError naming ``field`` otherwise."""
    amount, sep, period = text.partition("/")
    try:
        value = float(amount)
    except ValueError:
        value = -1.0
    if not sep or value < 0 or not math.isfinite(value) or period not in Period._value2member_map_:
        raise ValueError(
            f"{field}: {text!r} is not AMOUNT/PERIOD such as 500/month (period: day, week, month)"
        )
    return Budget(limit_micros=round(value * MICROS), period=Period(period))
