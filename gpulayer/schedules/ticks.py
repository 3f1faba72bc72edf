"""Cron ticks as UTC instants, in a schedule's timezone. Pure: no clock, no I/O.

croniter walks naive wall-clock times; zoneinfo turns each into an instant. Two daylight-saving
cases need a rule, and the rule is the one Vixie cron follows. It splits expressions in two:
wildcard ones, whose minute or hour field starts with `*` (`*/15 1 * * *`, `30 * * * *`,
`@hourly`), and fixed-time ones (`30 2 * * *`, `0,30 1 * * *`):

- A wall time inside a spring-forward gap does not exist. A fixed-time tick fires at the end of
  the gap (the first instant after the change), several such ticks folding into that one
  instant, so none is lost and none doubled; a wildcard expression follows the new time, so it
  fires at its next wall time that exists.
- A wall time inside a fall-back overlap exists twice. A fixed-time tick fires at its first
  occurrence only, so a job set for 01:30 runs once on that day; a wildcard expression follows
  the clock, so it fires in both passes of the repeated hour.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

# The shorthands Vixie cron and Kubernetes CronJobs take; @annually and @midnight are their
# second names for @yearly and @daily (croniter reads all seven).
KEYWORDS = frozenset(
    {"@hourly", "@daily", "@midnight", "@weekly", "@monthly", "@yearly", "@annually"}
)

_UTC = timezone.utc


class CronError(ValueError):
    """An expression croniter does not accept, or one that never fires."""


def zone(name: str) -> ZoneInfo:
    """The IANA zone; ValueError naming it when unknown."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown zone {name!r}") from None


def check_expression(expression: str) -> str:
    """The expression, normalized; CronError saying what is wrong with it."""
    from croniter import croniter

    text = " ".join(expression.split())
    if text.startswith("@"):
        if text not in KEYWORDS:
            raise CronError(f"{expression!r}: known shorthands are {', '.join(sorted(KEYWORDS))}")
        return text
    fields = text.split(" ")
    if len(fields) not in (5, 6):
        raise CronError(
            f"{expression!r} has {len(fields)} fields; expected 5, or 6 with seconds first"
        )
    if not croniter.is_valid(text, second_at_beginning=len(fields) == 6):
        raise CronError(f"{expression!r} is not a valid cron expression")
    try:
        next(_walls(text, datetime(2000, 1, 1)))
    except StopIteration:
        raise CronError(f"{expression!r} never fires") from None
    return text


def is_wildcard(expression: str) -> bool:
    """Vixie cron's wildcard job: its minute or hour field starts with ``*``."""
    if expression.startswith("@"):
        return expression == "@hourly"
    fields = expression.split(" ")
    minute, hour = fields[-5], fields[-4]  # six fields put seconds first
    return minute.startswith("*") or hour.startswith("*")


def _walls(expression: str, start: datetime) -> Iterator[datetime]:
    """Naive wall-clock matches strictly after start."""
    from croniter import CroniterBadDateError, croniter

    six = len(expression.split(" ")) == 6
    walker = croniter(expression, start, second_at_beginning=six, max_years_between_matches=50)
    while True:
        try:
            yield walker.get_next(datetime)
        except CroniterBadDateError:
            return


def _instant(local: datetime) -> datetime:
    return local.astimezone(_UTC)


def _exists(wall: datetime, tz: ZoneInfo) -> bool:
    aware = wall.replace(tzinfo=tz)
    return _instant(aware).astimezone(tz).replace(tzinfo=None) == wall


def _gap_end(wall: datetime, tz: ZoneInfo) -> datetime:
    """The instant a spring-forward gap holding wall ends: where the UTC offset changes."""
    early = _instant(wall.replace(tzinfo=tz, fold=1))  # read with the later offset: before
    late = _instant(wall.replace(tzinfo=tz, fold=0))  # read with the earlier offset: after
    low, high = early, late
    while high - low > timedelta(seconds=1):
        middle = low + (high - low) / 2
        if middle.astimezone(tz).utcoffset() == early.astimezone(tz).utcoffset():
            low = middle
        else:
            high = middle
    return high.replace(microsecond=0)


def wall_instants(wall: datetime, tz: ZoneInfo, wildcard: bool) -> list[datetime]:
    """The instants one wall-clock match fires at: none (a wildcard's wall time in a gap), one,
    or two (a wildcard's in an overlap)."""
    if not _exists(wall, tz):
        return [] if wildcard else [_gap_end(wall, tz)]
    first = _instant(wall.replace(tzinfo=tz, fold=0))
    second = _instant(wall.replace(tzinfo=tz, fold=1))
    if second != first and wildcard:
        return [first, second]
    return [first]


def _overlap(local: datetime, tz: ZoneInfo) -> timedelta:
    """How long the fall-back overlap holding this wall time is (zero outside one)."""
    first = local.replace(tzinfo=tz, fold=0).utcoffset()
    second = local.replace(tzinfo=tz, fold=1).utcoffset()
    if first is None or second is None or first <= second:
        return timedelta(0)
    return first - second


def _expression_ticks(expression: str, tz: ZoneInfo, after: datetime) -> Iterator[datetime]:
    """Instants of one expression after `after`, in order.

    A wall time's first instant never precedes an earlier wall time's first instant, so the
    walk emits what is pending up to the current first instant; only second occurrences in an
    overlap wait. Starting inside an overlap, the walk starts one overlap earlier, since the
    second occurrences of wall times before `after`'s own come after it.
    """
    wildcard = is_wildcard(expression)
    local = after.astimezone(tz).replace(tzinfo=None, fold=0)
    pending: list[datetime] = []
    last: datetime | None = None
    for wall in _walls(expression, local - _overlap(local, tz)):
        moments = wall_instants(wall, tz, wildcard)
        if not moments:
            continue
        for moment in moments:
            if moment > after:
                heapq.heappush(pending, moment)
        while pending and pending[0] <= moments[0]:
            moment = heapq.heappop(pending)
            if moment != last:
                last = moment
                yield moment
    while pending:
        moment = heapq.heappop(pending)
        if moment != last:
            last = moment
            yield moment


def iter_ticks(expressions: Sequence[str], tz: ZoneInfo, after: datetime) -> Iterator[datetime]:
    """Every tick strictly after `after` (aware), the union of the expressions, in order."""
    merged = heapq.merge(*(_expression_ticks(e, tz, after) for e in expressions))
    last: datetime | None = None
    for moment in merged:
        if moment != last:
            last = moment
            yield moment


def next_ticks(
    expressions: Sequence[str], tz: ZoneInfo, after: datetime, count: int
) -> list[datetime]:
    found: list[datetime] = []
    for moment in iter_ticks(expressions, tz, after):
        found.append(moment)
        if len(found) >= count:
            break
    return found


def ticks_between(
    expressions: Sequence[str], tz: ZoneInfo, after: datetime, until: datetime, keep: int
) -> tuple[list[datetime], bool, datetime | None]:
    """The newest `keep` ticks in (after, until], whether older ones may be left out, and the
    first tick after `until` (None if it never fires again).

    A long outage of a per-second schedule holds ~86,400 ticks a day; the walk starts a short
    window before `until` and widens it only while it finds nothing.
    """
    for window in (*_WINDOWS, None):
        start = after if window is None or until - window <= after else until - window
        newest: deque[datetime] = deque(maxlen=keep)
        total = 0
        following = None
        for moment in iter_ticks(expressions, tz, start):
            if moment > until:
                following = moment
                break
            newest.append(moment)
            total += 1
        if newest or start == after:
            return list(newest), start != after or total > len(newest), following
    raise AssertionError("unreachable")


_WINDOWS = (
    timedelta(minutes=5),
    timedelta(hours=1),
    timedelta(days=2),
    timedelta(days=40),
    timedelta(days=800),
)


@lru_cache(maxsize=4096)
def cached_next_tick(expressions: tuple[str, ...], zone_name: str, after: float) -> float | None:
    """The next tick after an epoch time, as an epoch time; None when it never fires again."""
    moment = next(
        iter_ticks(expressions, zone(zone_name), datetime.fromtimestamp(after, _UTC)), None
    )
    return None if moment is None else moment.timestamp()
