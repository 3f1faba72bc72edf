"""The dashboard's pure parts: daily totals, SVG charts, a job's timeline, the jobs filters."""

from __future__ import annotations

from datetime import date

import pytest

from gpulayer.control.store import AttemptRecord, InstanceRecord, JobRecord
from gpulayer.control.ui.charts import (
    Interval,
    daily_bars_svg,
    daily_totals,
    day_start,
    timeline_svg,
)
from gpulayer.control.ui.pages import offers_spec, parse_job_filters
from gpulayer.control.ui.timeline import cloud_phases, job_segments
from gpulayer.errors import UsageError
from gpulayer.schedules import SCHEDULE_LABEL

TODAY = date(2026, 3, 10)
T0 = day_start(TODAY)


def test_an_interval_across_midnight_is_split_between_the_two_days() -> None:
    start = T0 - 3600  # 23:00 yesterday
    axis, series = daily_totals([Interval("aws", start, start + 3 * 3600, 2.0)], today=TODAY)
    assert len(axis) == 30 and axis[-1] == TODAY
    assert series["aws"][-2] == pytest.approx(2.0)  # one hour yesterday at 2/h
    assert series["aws"][-1] == pytest.approx(4.0)  # two hours today
    assert sum(series["aws"]) == pytest.approx(6.0)


def test_days_outside_the_window_and_zero_rates_count_nothing() -> None:
    old = T0 - 40 * 86400
    _, series = daily_totals(
        [Interval("aws", old, old + 3600, 5.0), Interval("gcp", T0, T0 + 60, 0.0)], today=TODAY
    )
    assert series == {}


def test_bars_stack_per_provider_and_escape_names() -> None:
    axis, series = daily_totals(
        [Interval("aws", T0, T0 + 3600, 3.0), Interval("<gcp>", T0, T0 + 3600, 1.0)],
        today=TODAY,
    )
    svg = str(daily_bars_svg(axis, series, title="Spend", unit="USD"))
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert "&lt;gcp&gt;" in svg and "<gcp>" not in svg
    assert svg.count("<rect") == 2 + 2  # two bars, two legend keys
    assert " style=" not in svg  # colours as attributes: a strict CSP allows no inline style
    assert ">5.00<" in svg  # the scale's top is the next round number over 4


def test_an_empty_chart_says_so() -> None:
    axis, series = daily_totals([], today=TODAY)
    assert "nothing in the last 30 days" in str(daily_bars_svg(axis, series, title="t", unit="u"))


def _job(**values: object) -> JobRecord:
    base = dict(
        id="j-1", name="n", spec={}, state="succeeded", reason=None, message=None,
        exit_code=0, result=None, target="cloud", working_dir=None, has_bundle=False,
        attempts=1, cancel_requested=False, created_at=100.0, started_at=None,
        finished_at=400.0,
    )
    base.update(values)
    return JobRecord(**base)  # type: ignore[arg-type]


def _attempt(started: float, finished: float | None) -> AttemptRecord:
    return AttemptRecord(1, "j-1", 1, "w", [0], "succeeded", None, 0, started, started, finished)


def _instance(**values: object) -> InstanceRecord:
    base = dict(
        request_id="r", job_id="j-1", owner="o", provider="aws", region="us-east-1", zone=None,
        instance_type="g5.xlarge", instance_id="i-1", state="terminated", ssh_host=None,
        key_path=None, hourly_price=1.0, currency="USD", spot=False, tags={},
        created_at=110.0, launched_at=120.0, ready_at=200.0, ended_at=450.0, note=None,
    )
    base.update(values)
    return InstanceRecord(**base)  # type: ignore[arg-type]


def test_a_cloud_job_has_queued_provisioning_running_and_teardown_in_order() -> None:
    segments = job_segments(_job(), [_attempt(210.0, 390.0)], [_instance()], now=1000.0)
    assert segments == [
        ("queued", 100.0, 110.0),
        ("provisioning", 110.0, 200.0),
        ("running", 210.0, 390.0),
        ("teardown", 400.0, 450.0),
    ]
    svg = str(timeline_svg(segments))
    assert svg.count('class="phase ') == 4


def test_an_attempts_setup_is_its_own_phase_before_running() -> None:
    segments = job_segments(
        _job(), [_attempt(210.0, 390.0)], [_instance()], now=1000.0, setup_spans={1: (211.0, 250.0)}
    )
    assert segments == [
        ("queued", 100.0, 110.0),
        ("provisioning", 110.0, 200.0),
        ("setup", 210.0, 250.0),
        ("running", 250.0, 390.0),
        ("teardown", 400.0, 450.0),
    ]
    # A setup line logged after the attempt's end never pushes running past it.
    late = job_segments(_job(), [_attempt(210.0, 390.0)], [], now=1000.0, setup_spans={1: (220.0, 500.0)})
    assert ("setup", 210.0, 390.0) in late and ("running", 390.0, 390.0) in late


def test_a_running_local_job_runs_until_now() -> None:
    job = _job(state="running", finished_at=None, target="local")
    segments = job_segments(job, [_attempt(150.0, None)], [], now=500.0)
    assert segments == [("queued", 100.0, 150.0), ("running", 150.0, 500.0)]


def test_cloud_phases_have_durations_and_mark_the_open_one() -> None:
    phases = cloud_phases(_instance(ended_at=None, state="in_use"), now=300.0)
    assert [(p["phase"], p["seconds"], p["open"]) for p in phases] == [
        ("requested", 10.0, False),
        ("booting", 80.0, False),
        ("in use", 100.0, True),
    ]


def test_cloud_phases_follow_the_transition_history_where_there_is_one() -> None:
    from gpulayer.control.store import TransitionRecord

    history = [
        TransitionRecord("r-1", None, "requested", "", 100.0),
        TransitionRecord("r-1", "requested", "launching", "", 101.0),
        TransitionRecord("r-1", "launching", "booting", "", 130.0),
        TransitionRecord("r-1", "booting", "bootstrapping", "", 140.0),
        TransitionRecord("r-1", "bootstrapping", "ready", "", 170.0),
        TransitionRecord("r-1", "ready", "in_use", "", 171.0),
    ]
    phases = cloud_phases(_instance(ended_at=None, state="in_use"), 200.0, history)
    assert [(p["phase"], p["seconds"], p["open"]) for p in phases] == [
        ("provision", 30.0, False),
        ("ssh", 10.0, False),
        ("bootstrap", 30.0, False),
        ("dispatch", 1.0, False),
        ("run", 29.0, True),
    ]


def test_job_filters_parse_and_name_a_bad_field() -> None:
    filters = parse_job_filters(
        {"state": "running", "label": "team=vision, env=prod", "schedule": "nightly", "page": "2"}
    )
    assert filters["labels"] == {"team": "vision", "env": "prod", SCHEDULE_LABEL: "nightly"}
    assert filters["page"] == 2
    for query, field in (({"state": "x"}, "state"), ({"label": "a"}, "label"),
                         ({"page": "-1"}, "page")):
        with pytest.raises(UsageError, match=f"^{field}:"):
            parse_job_filters(query)


def test_offers_filters_build_the_spec_offers_would() -> None:
    spec = offers_spec({"gpu": "A100, H100", "gpus": "2", "max_hourly_cost": "9.5",
                        "provider": "aws", "region": ""})
    assert spec["resources"] == {"gpu_models": ["A100", "H100"], "accelerator": "cuda",
                                 "gpu_count": 2}
    assert spec["placement"] == {"max_hourly_cost": 9.5, "providers": ["aws"]}
    with pytest.raises(UsageError, match=r"^max_hourly_cost:"):
        offers_spec({"max_hourly_cost": "cheap"})


def test_the_command_line_loads_neither_jinja2_nor_fastapi() -> None:
    import subprocess
    import sys

    probe = (
        "import sys, gpulayer.cli.app; "
        "print(','.join(m for m in ('jinja2', 'fastapi', 'starlette') if m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == ""
