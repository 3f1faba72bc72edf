"""Scheduled runs: the Schedule contract, cron ticks in a timezone, and the decisions the
control plane's firing loop applies (concurrency, catch-up, deadline, budget). Pure, no I/O."""

from gpulayer.schedules.model import (
    SCHEDULE_LABEL,
    SKIP_REASONS,
    TICK_LABEL,
    Budget,
    Cron,
    Schedule,
    worst_case_cost,
)
from gpulayer.schedules.validate import schedule_json_schema, validate_schedule

__all__ = [
    "SCHEDULE_LABEL",
    "SKIP_REASONS",
    "TICK_LABEL",
    "Budget",
    "Cron",
    "Schedule",
    "schedule_json_schema",
    "validate_schedule",
    "worst_case_cost",
]
