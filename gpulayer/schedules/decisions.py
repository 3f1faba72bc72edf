"""What to do with each due tick: run it, or skip it and say why. Pure: times come in as values.

The firing loop gathers the facts (due ticks, live runs, the period's spend) and applies these
decisions; whichever control plane records a tick first in the store is the one that acts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from gpulayer.schedules.model import CatchUp, Concurrency, Period
from gpulayer.schedules.ticks import wall_instants

_UTC = timezone.utc


@dataclass(frozen=True)
class Skip:
    tick: datetime
    reason: str
    message: str = ""


@dataclass(frozen=True)
class Start:
    tick: datetime
    replace: tuple[str, ...] = field(default_factory=tuple)
    """Live runs to cancel first (concurrency replace)."""


Decision = Start | Skip


def triage(
    due: Sequence[datetime], *, suspended: bool, catch_up: CatchUp, loop_started: datetime
) -> tuple[list[Skip], list[datetime]]:
    """Split due ticks (oldest first) into skips and candidates to start.

    A tick older than this control plane's firing loop came while none ran: catch_up none
    skips all of those, latest keeps the newest one, unless a tick that came on time
    supersedes it.
    """
    if suspended:
        return [Skip(t, "suspended") for t in due], []
    missed = [t for t in due if t < loop_started]
    on_time = [t for t in due if t >= loop_started]
    keep: list[datetime] = []
    if missed and catch_up == "latest" and not on_time:
        keep = [missed[-1]]
    skips = [
        Skip(t, "catch_up", "missed while no control plane ran") for t in missed if t not in keep
    ]
    return skips, keep + on_time


@dataclass(frozen=True)
class BudgetState:
    max_cost: float
    spent: float
    """Ended runs' cost in the period, plus live runs at their worst case (or more if accrued)."""
    next_run: float
    """The next run's worst case."""

    @property
    def fits(self) -> bool:
        return self.spent + self.next_run <= self.max_cost + 1e-9

    @property
    def left(self) -> float:
        return max(0.0, self.max_cost - self.spent)


def decide_start(
    tick: datetime,
    *,
    now: datetime,
    starting_deadline_seconds: float | None,
    concurrency: Concurrency,
    live_runs: Sequence[str],
    budget: BudgetState | None,
    manual: bool = False,
) -> Decision:
    """One candidate tick: the deadline first, then concurrency, then the budget."""
    late = (now - tick).total_seconds()
    if not manual and starting_deadline_seconds is not None and late > starting_deadline_seconds:
        return Skip(tick, "deadline", f"{late:.1f} s late; deadline {starting_deadline_seconds} s")
    replace: tuple[str, ...] = ()
    if live_runs:
        if concurrency == "forbid":
            return Skip(tick, "concurrency", f"run {live_runs[0]} is still live")
        if concurrency == "replace":
            replace = tuple(live_runs)
    if budget is not None and not budget.fits:
        return Skip(
            tick,
            "budget_exhausted",
            f"spent {budget.spent:.4f} of {budget.max_cost:g}; the next run may cost "
            f"{budget.next_run:.4f}",
        )
    return Start(tick, replace)


# --- budget periods and spend ---------------------------------------------------------------


def _local_midnight(day: datetime, tz: ZoneInfo) -> datetime:
    wall = datetime(day.year, day.month, day.day)
    return wall_instants(wall, tz, wildcard=False)[0]


def budget_period(period: Period, tz: ZoneInfo, now: datetime) -> tuple[datetime, datetime]:
    """[start, end) of the budget period holding now, in the schedule's timezone."""
    local = now.astimezone(tz)
    if period == "day":
        first = local
        following = local + timedelta(days=1)
    elif period == "week":
        first = local - timedelta(days=local.weekday())
        following = first + timedelta(days=7)
    else:
        first = local.replace(day=1)
        following = (first.replace(day=28) + timedelta(days=4)).replace(day=1)
    return _local_midnight(first, tz), _local_midnight(following, tz)


@dataclass(frozen=True)
class LedgerEntry:
    """One instance a schedule's run rented, as the cost ledger holds it."""

    hourly_price: float | None
    launched_at: float | None
    ended_at: float | None


def accrued(entry: LedgerEntry, start: float, end: float, now: float) -> float:
    """What the instance cost inside [start, end), up to now."""
    if entry.hourly_price is None or entry.launched_at is None:
        return 0.0
    stop = min(end, now if entry.ended_at is None else entry.ended_at)
    seconds = stop - max(start, entry.launched_at)
    return entry.hourly_price * max(0.0, seconds) / 3600.0


@dataclass(frozen=True)
class RunCost:
    live: bool
    worst_case: float
    instances: tuple[LedgerEntry, ...]


def period_spend(runs: Sequence[RunCost], start: float, end: float, now: float) -> float:
    """Ended runs count what they cost; a live run reserves its worst case until it ends."""
    total = 0.0
    for run in runs:
        cost = sum(accrued(entry, start, end, now) for entry in run.instances)
        total += max(cost, run.worst_case) if run.live else cost
    return total


def epoch(moment: datetime) -> float:
    return moment.timestamp()


def from_epoch(value: float) -> datetime:
    return datetime.fromtimestamp(value, _UTC)
