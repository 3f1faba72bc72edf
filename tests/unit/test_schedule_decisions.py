"""The firing loop's decisions, as pure functions: catch-up, deadline, concurrency, budget."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gpulayer.errors import SpecError
from gpulayer.schedules import validate_schedule, worst_case_cost
from gpulayer.schedules.decisions import (
    BudgetState,
    LedgerEntry,
    RunCost,
    Skip,
    Start,
    accrued,
    budget_period,
    decide_start,
    period_spend,
    triage,
)
from gpulayer.schedules.ticks import zone

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_catch_up_latest_runs_only_the_newest_missed_tick() -> None:
    due = [at(0), at(2), at(4)]
    skips, start = triage(due, suspended=False, catch_up="latest", loop_started=at(5))
    assert start == [at(4)]
    assert [(s.tick, s.reason) for s in skips] == [(at(0), "catch_up"), (at(2), "catch_up")]


def test_catch_up_none_runs_no_missed_tick_but_runs_those_on_time() -> None:
    due = [at(0), at(2), at(6)]
    skips, start = triage(due, suspended=False, catch_up="none", loop_started=at(5))
    assert start == [at(6)]
    assert {s.reason for s in skips} == {"catch_up"} and len(skips) == 2


def test_an_on_time_tick_supersedes_the_missed_one() -> None:
    skips, start = triage([at(0), at(6)], suspended=False, catch_up="latest", loop_started=at(5))
    assert start == [at(6)] and [s.tick for s in skips] == [at(0)]


def test_suspended_skips_everything() -> None:
    skips, start = triage([at(6), at(8)], suspended=True, catch_up="latest", loop_started=at(0))
    assert start == [] and [s.reason for s in skips] == ["suspended", "suspended"]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("forbid", Skip), ("allow", Start), ("replace", Start)],
)
def test_concurrency_with_a_live_run(policy: str, expected: type) -> None:
    decision = decide_start(
        at(0),
        now=at(0.1),
        starting_deadline_seconds=None,
        concurrency=policy,  # type: ignore[arg-type]
        live_runs=["j-live"],
        budget=None,
    )
    assert isinstance(decision, expected)
    if isinstance(decision, Skip):
        assert decision.reason == "concurrency"
    else:
        assert decision.replace == (("j-live",) if policy == "replace" else ())


def test_deadline_skips_a_late_tick_but_not_a_trigger() -> None:
    kwargs = dict(starting_deadline_seconds=5, concurrency="forbid", live_runs=[], budget=None)
    late = decide_start(at(0), now=at(6), **kwargs)  # type: ignore[arg-type]
    assert isinstance(late, Skip) and late.reason == "deadline"
    assert isinstance(decide_start(at(0), now=at(4), **kwargs), Start)  # type: ignore[arg-type]
    assert isinstance(decide_start(at(0), now=at(60), manual=True, **kwargs), Start)  # type: ignore[arg-type]


def test_budget_skips_when_the_worst_case_would_not_fit() -> None:
    kwargs = dict(starting_deadline_seconds=None, concurrency="allow", live_runs=[])
    fits = BudgetState(max_cost=1.0, spent=0.5, next_run=0.5)
    over = BudgetState(max_cost=1.0, spent=0.51, next_run=0.5)
    assert isinstance(decide_start(at(0), now=at(0), budget=fits, **kwargs), Start)  # type: ignore[arg-type]
    skipped = decide_start(at(0), now=at(0), budget=over, **kwargs)  # type: ignore[arg-type]
    assert isinstance(skipped, Skip) and skipped.reason == "budget_exhausted"
    assert over.left == pytest.approx(0.49)


def test_live_runs_reserve_their_worst_case_and_ended_ones_count_what_they_cost() -> None:
    start, end, now = 0.0, 86400.0, 7200.0
    ended = RunCost(False, 10.0, (LedgerEntry(2.0, 0.0, 1800.0),))  # half an hour at 2/h
    live = RunCost(True, 3.0, (LedgerEntry(2.0, 3600.0, None),))  # accrued 2, reserves 3
    assert period_spend([ended, live], start, end, now) == pytest.approx(1.0 + 3.0)


def test_accrual_is_clipped_to_the_period() -> None:
    entry = LedgerEntry(3.6, launched_at=-1800.0, ended_at=1800.0)
    assert accrued(entry, 0.0, 3600.0, 10_000.0) == pytest.approx(1.8)
    assert accrued(LedgerEntry(None, 0.0, 10.0), 0.0, 3600.0, 20.0) == 0.0


@pytest.mark.parametrize(
    ("period", "now", "tz", "start", "end"),
    [
        (
            "day",
            "2026-03-29T12:00",
            "Europe/Berlin",
            "2026-03-29T00:00+01:00",
            "2026-03-30T00:00+02:00",
        ),
        ("week", "2026-06-03T12:00", "UTC", "2026-06-01T00:00+00:00", "2026-06-08T00:00+00:00"),
        (
            "month",
            "2026-12-31T23:30",
            "America/New_York",
            "2026-12-01T00:00-05:00",
            "2027-01-01T00:00-05:00",
        ),
    ],
)
def test_budget_periods_in_the_schedules_zone(
    period: str, now: str, tz: str, start: str, end: str
) -> None:
    found = budget_period(
        period, zone(tz), datetime.fromisoformat(now).replace(tzinfo=timezone.utc)
    )  # type: ignore[arg-type]
    assert found == (datetime.fromisoformat(start), datetime.fromisoformat(end))


def _document(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {
        "name": "nightly",
        "cron": "0 4 * * *",
        "job": {"workload": {"kind": "command", "command": ["true"]}},
    }
    base.update(fields)
    return base


@pytest.mark.parametrize(
    ("fields", "line"),
    [
        ({"timezone": "Europe/Berln"}, "timezone: unknown zone 'Europe/Berln'"),
        ({"cron": "0 4 * *"}, "cron: '0 4 * *' has 4 fields"),
        ({"cron": []}, "cron: give at least one expression"),
        ({"concurrency": "sometimes"}, "concurrency: 'sometimes' is not allowed"),
        ({"history_limit": -1}, "history_limit:"),
        ({"colour": "red"}, "colour: unknown field"),
        ({"budget": {"max_cost": 0}}, "budget.max_cost:"),
        (
            {
                "budget": {"max_cost": 5},
                "job": {
                    "workload": {"kind": "command", "command": ["x"]},
                    "placement": {"target": "cloud"},
                },
            },
            "job.placement.max_hourly_cost: required with a budget",
        ),
        (
            {"job": {"workload": {"kind": "command", "command": []}}},
            "job.workload.command:",
        ),
    ],
)
def test_bad_documents_name_the_field(fields: dict[str, object], line: str) -> None:
    with pytest.raises(SpecError) as caught:
        validate_schedule(_document(**fields))
    assert any(found.startswith(line) for found in caught.value.lines), caught.value.lines


@pytest.mark.parametrize("cron", ["@annually", "@midnight", ["@midnight", "@annually"]])
def test_the_vixie_cron_aliases_are_valid_schedules(cron: object) -> None:
    assert validate_schedule(_document(cron=cron)).cron == cron


def test_defaults_and_the_worst_case_of_a_cloud_run() -> None:
    schedule = validate_schedule(
        _document(
            budget={"max_cost": 60},
            job={
                "workload": {"kind": "command", "command": ["x"]},
                "placement": {"target": "cloud", "max_hourly_cost": 3},
                "timeout_seconds": 1800,
            },
        )
    )
    assert (schedule.concurrency, schedule.catch_up, schedule.timezone) == (
        "forbid",
        "latest",
        "UTC",
    )
    assert schedule.job.name == "nightly"
    assert worst_case_cost(schedule.job) == pytest.approx(3 * (1800 + 600) / 3600)
    local = validate_schedule(_document())
    assert worst_case_cost(local.job) == 0.0


def test_the_published_schema_agrees_with_validation() -> None:
    from jsonschema import Draft202012Validator, ValidationError

    from gpulayer.schedules import schedule_json_schema

    schema = schedule_json_schema()
    Draft202012Validator.check_schema(schema)
    validator = Draft202012Validator(schema)
    good = _document(cron=["0 4 * * *", "*/2 * * * * *"], budget={"max_cost": 5, "period": "week"})
    validate_schedule(good)
    validator.validate(good)
    for bad in (_document(colour="red"), _document(concurrency="sometimes"), _document(job=None)):
        with pytest.raises(ValidationError):
            validator.validate(bad)
        with pytest.raises(SpecError):
            validate_schedule(bad)
