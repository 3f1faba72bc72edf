"""The JSON shapes of schedules and their runs (the API's answers, `--json` output)."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from gpulayer.control.schedule_service import Loaded, ScheduleService
from gpulayer.control.store import ScheduleRunRecord
from gpulayer.control.views import iso
from gpulayer.schedules.decisions import budget_period, from_epoch
from gpulayer.schedules.ticks import zone


def _local(ts: float, tz_name: str, timespec: str = "seconds") -> str:
    return from_epoch(ts).astimezone(zone(tz_name)).isoformat(timespec=timespec)


def run_view(
    schedules: ScheduleService, run: ScheduleRunRecord, tz_name: str, now: float
) -> dict[str, Any]:
    cost = None
    if run.job_id is not None:
        prices = [i.cost(now) for i in schedules.store.list_instances(job_id=run.job_id)]
        cost = round(sum(p for p in prices if p is not None), 6)
    return {
        "tick": _local(run.tick, tz_name, "milliseconds" if run.manual else "seconds"),
        "manual": run.manual,
        "outcome": run.outcome,
        "skipped": None if run.outcome == "created" else run.outcome,
        "job_id": run.job_id,
        "job_state": run.job_state,
        "cost": cost,
        "message": run.message,
        "decided_at": iso(run.created_at),
        "late_seconds": None if run.manual else round(run.created_at - run.tick, 3),
    }


def budget_view(schedules: ScheduleService, loaded: Loaded, now: float) -> dict[str, Any] | None:
    budget = loaded.schedule.budget
    state = schedules.budget_state(loaded, now)
    if budget is None or state is None:
        return None
    start, end = budget_period(budget.period, zone(loaded.schedule.timezone), from_epoch(now))
    return {
        "max_cost": budget.max_cost,
        "currency": budget.currency,
        "period": budget.period,
        "period_start": start.astimezone(zone(loaded.schedule.timezone)).isoformat(),
        "period_end": end.astimezone(zone(loaded.schedule.timezone)).isoformat(),
        "spent": round(state.spent, 6),
        "left": round(state.left, 6),
        "next_run_worst_case": round(state.next_run, 6),
        "next_run_fits": state.fits,
    }


def schedule_summary(schedules: ScheduleService, loaded: Loaded) -> dict[str, Any]:
    now = time.time()
    record, schedule = loaded.record, loaded.schedule
    upcoming: list[datetime] = [] if record.suspend else schedules.next_ticks(loaded, 1, now)
    runs = schedules.store.schedule_runs(record.id, limit=1)
    return {
        "id": record.id,
        "name": record.name,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "concurrency": schedule.concurrency,
        "catch_up": schedule.catch_up,
        "state": "paused" if record.suspend else "active",
        "next_tick": upcoming[0].isoformat() if upcoming else None,
        "last_run": run_view(schedules, runs[0], schedule.timezone, now) if runs else None,
        "live_runs": schedules.store.live_schedule_jobs(record.id),
        "budget": budget_view(schedules, loaded, now),
        "created_at": iso(record.created_at),
        "updated_at": iso(record.updated_at),
    }


def schedule_detail(schedules: ScheduleService, loaded: Loaded, runs: int = 10) -> dict[str, Any]:
    now = time.time()
    view = schedule_summary(schedules, loaded)
    view["next_ticks"] = [t.isoformat() for t in schedules.next_ticks(loaded, 5, now)]
    view["runs"] = [
        run_view(schedules, r, loaded.schedule.timezone, now)
        for r in schedules.store.schedule_runs(loaded.record.id, limit=runs)
    ]
    view["spec"] = loaded.record.spec
    return view
