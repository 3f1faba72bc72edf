"""Cron ticks in a timezone, daylight-saving days included: no tick lost, none doubled."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone

import pytest

from gpulayer.schedules.ticks import CronError, check_expression, next_ticks, ticks_between, zone

UTC = timezone.utc


def local_ticks(expression: str, tz_name: str, start_utc: str, count: int) -> list[str]:
    tz = zone(tz_name)
    start = datetime.fromisoformat(start_utc).replace(tzinfo=UTC)
    return [t.astimezone(tz).isoformat() for t in next_ticks([expression], tz, start, count)]


# (expression, zone, start in UTC, expected local ticks). Spring: the gap's wall times fire
# once at the end of the gap; fall: a time of day fires at its first occurrence only, while an
# every-hour expression fires in both passes of the repeated hour.
DST_TABLE = [
    (
        "30 2 * * *",
        "Europe/Berlin",
        "2026-03-28T00:00",
        ["2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"],
    ),
    (
        "30 2 * * *",
        "Europe/Berlin",
        "2026-10-24T00:00",
        ["2026-10-24T02:30:00+02:00", "2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"],
    ),
    (
        "*/30 * * * *",
        "Europe/Berlin",
        "2026-03-29T00:10",
        ["2026-03-29T01:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-29T03:30:00+02:00"],
    ),
    (
        "0 * * * *",
        "Europe/Berlin",
        "2026-10-24T23:30",
        [
            "2026-10-25T02:00:00+02:00",
            "2026-10-25T02:00:00+01:00",
            "2026-10-25T03:00:00+01:00",
        ],
    ),
    (
        "0 2 * * *",
        "America/New_York",
        "2026-03-07T12:00",
        ["2026-03-08T03:00:00-04:00", "2026-03-09T02:00:00-04:00"],
    ),
    (
        "30 1 * * *",
        "America/New_York",
        "2026-10-31T12:00",
        ["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"],
    ),
    # A `*` in the minute field makes a wildcard job (Vixie cron): it follows the new time, so
    # both passes of the repeated hour fire.
    (
        "*/20 1 * * *",
        "America/New_York",
        "2026-11-01T04:30",
        [
            "2026-11-01T01:00:00-04:00",
            "2026-11-01T01:20:00-04:00",
            "2026-11-01T01:40:00-04:00",
            "2026-11-01T01:00:00-05:00",
            "2026-11-01T01:20:00-05:00",
            "2026-11-01T01:40:00-05:00",
            "2026-11-02T01:00:00-05:00",
        ],
    ),
    (
        "*/15 1 * * *",
        "America/New_York",
        "2026-11-01T05:50",
        ["2026-11-01T01:00:00-05:00", "2026-11-01T01:15:00-05:00"],
    ),
    # A fixed minute with a `*` hour is a wildcard job too; in the spring gap it fires by the
    # new time (03:30), and the skipped 02:30 is not made up at 03:00.
    (
        "30 * * * *",
        "Europe/Berlin",
        "2026-03-29T00:10",
        ["2026-03-29T01:30:00+01:00", "2026-03-29T03:30:00+02:00"],
    ),
    # A fixed time of day in the repeated hour fires once, whatever its minute list.
    (
        "0,20,40 1 * * *",
        "America/New_York",
        "2026-11-01T04:30",
        [
            "2026-11-01T01:00:00-04:00",
            "2026-11-01T01:20:00-04:00",
            "2026-11-01T01:40:00-04:00",
            "2026-11-02T01:00:00-05:00",
        ],
    ),
    (
        "0 0 * * * *",
        "America/New_York",
        "2026-11-01T04:30",
        ["2026-11-01T01:00:00-04:00", "2026-11-01T01:00:00-05:00", "2026-11-01T02:00:00-05:00"],
    ),
]


@pytest.mark.parametrize(("expression", "tz", "start", "expected"), DST_TABLE)
def test_daylight_saving_days(expression: str, tz: str, start: str, expected: list[str]) -> None:
    assert local_ticks(expression, tz, start, len(expected)) == expected


@pytest.mark.parametrize("tz", ["Europe/Berlin", "America/New_York"])
def test_a_whole_year_of_daily_ticks_has_one_per_day(tz: str) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    ticks = next_ticks(["30 2 * * *"], zone(tz), start, 365)
    days = [t.astimezone(zone(tz)).date() for t in ticks]
    assert len(set(days)) == 365  # none lost at the spring change, none doubled in the fall
    assert all(b > a for a, b in itertools.pairwise(ticks))


@pytest.mark.parametrize("tz", ["Europe/Berlin", "America/New_York"])
def test_hourly_ticks_follow_elapsed_hours_across_both_changes(tz: str) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    ticks = next_ticks(["@hourly"], zone(tz), start, 24 * 365)
    gaps = {(b - a).total_seconds() for a, b in itertools.pairwise(ticks)}
    assert gaps == {3600.0}


def test_six_fields_put_seconds_first_and_lists_fire_on_the_union() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    ticks = next_ticks(["*/2 * * * * *", "3 * * * * *"], zone("UTC"), start, 4)
    assert [t.second for t in ticks] == [2, 3, 4, 6]


def test_ticks_between_keeps_the_newest_of_a_long_outage() -> None:
    after = datetime(2026, 1, 1, tzinfo=UTC)
    until = datetime(2026, 1, 2, tzinfo=UTC)
    newest, more, following = ticks_between(["* * * * * *"], zone("UTC"), after, until, 10)
    assert newest[-1] == until and len(newest) == 10 and more
    assert following == until + timedelta(seconds=1)
    monthly, _, _ = ticks_between(["0 4 1 * *"], zone("UTC"), after, until.replace(month=3), 10)
    assert monthly[-1] == datetime(2026, 3, 1, 4, tzinfo=UTC)  # the newest is what counts


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("61 * * * *", "not a valid cron"),
        ("* * * *", "4 fields"),
        ("* * * * * * *", "7 fields"),
        ("0 0 30 2 *", "never fires"),
        ("@reboot", "shorthands"),
        ("@annualy", "@annually"),
    ],
)
def test_bad_expressions_say_what_is_wrong(expression: str, fragment: str) -> None:
    with pytest.raises(CronError, match=fragment):
        check_expression(expression)


def test_shorthands_and_spacing_are_normalized() -> None:
    assert check_expression("@daily") == "@daily"
    assert check_expression(" 0  4 * * * ") == "0 4 * * *"


@pytest.mark.parametrize(("alias", "same_as"), [("@annually", "@yearly"), ("@midnight", "@daily")])
def test_vixie_cron_aliases_fire_as_the_shorthands_they_stand_for(alias: str, same_as: str) -> None:
    # Vixie cron and Kubernetes CronJobs take both names; a schedule copied from either works here.
    assert check_expression(alias) == alias
    start = datetime(2026, 3, 1, tzinfo=UTC)
    berlin = zone("Europe/Berlin")
    assert next_ticks([alias], berlin, start, 3) == next_ticks([same_as], berlin, start, 3)
    assert next_ticks([alias], berlin, start, 1)[0].astimezone(berlin).hour == 0
