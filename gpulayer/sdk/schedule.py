"""`gl.schedule(...)`: a job that runs on a cron, kept by the control plane; the Schedule handle.

gl.schedule(gl.command(["python", "eval.py"]), name="nightly-eval",
            cron=gl.Cron("0 4 * * *", timezone="Europe/Berlin"),
            budget={"max_cost": 60, "period": "month"})
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from gpulayer.errors import GpulayerError, UsageError
from gpulayer.protocol.client import ControlClient
from gpulayer.schedules.model import Budget, Cron
from gpulayer.sdk.job import Job

SCHEDULE_OPTIONS = frozenset(
    {
        "timezone",
        "concurrency",
        "catch_up",
        "starting_deadline_seconds",
        "suspend",
        "budget",
        "history_limit",
    }
)


class ScheduleSkipped(GpulayerError):
    """trigger() was turned down by the schedule's concurrency policy or its budget."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def schedule_document(
    job: dict[str, Any],
    *,
    name: str,
    cron: str | list[str] | tuple[str, ...] | Cron,
    timezone: str | None = None,
    **options: Any,
) -> dict[str, Any]:
    """The Schedule document for a job's spec data; Cron carries its own timezone."""
    unknown = sorted(set(options) - SCHEDULE_OPTIONS)
    if unknown:
        raise UsageError(f"{unknown[0]}: not a schedule option")
    if isinstance(cron, Cron):
        if timezone is not None and timezone != cron.timezone:
            raise UsageError(
                f"timezone: {timezone!r} differs from the Cron's timezone {cron.timezone!r}"
            )
        timezone = cron.timezone
        cron = cron.expression
    document: dict[str, Any] = {
        "name": name,
        "cron": list(cron) if isinstance(cron, (list, tuple)) else cron,
        "job": job,
    }
    if timezone is not None:
        document["timezone"] = timezone
    for key, value in options.items():
        if value is None:
            continue
        if isinstance(value, Budget):
            value = value.model_dump(mode="json")
        document[key] = value
    return document


def schedule(
    what: Any,
    *args: Any,
    name: str,
    cron: str | list[str] | Cron,
    timezone: str | None = None,
    concurrency: str | None = None,
    budget: dict[str, Any] | Budget | None = None,
    server: str | None = None,
    **more: Any,
) -> Schedule:
    """Create (or replace, by name) a schedule that runs `what` on `cron`.

    `what` is whatever gl.launch takes (a builder, JobSpec, spec data or a function, then args
    go to it). Further schedule fields (catch_up, starting_deadline_seconds, suspend,
    history_limit) may be given by keyword; other keywords override job fields as in launch.
    """
    from gpulayer.schedules.validate import validate_schedule
    from gpulayer.sdk.connection import connect
    from gpulayer.sdk.launch import job_data
    from gpulayer.sdk.schedule_client import ScheduleClient
    from gpulayer.sdk.submission import source_fields

    options = {k: more.pop(k) for k in list(more) if k in SCHEDULE_OPTIONS - {"timezone"}}
    job = job_data(what, args, more)
    document = schedule_document(
        job,
        name=name,
        cron=cron,
        timezone=timezone,
        concurrency=concurrency,
        budget=budget,
        **options,
    )
    validate_schedule(document)  # bad input fails here, naming the field, before any call
    connection = connect(server)
    answer = ScheduleClient(connection.client).apply(document, **source_fields(connection, job))
    return Schedule(connection.client, answer["schedule"]["name"])


class Schedule:
    """A schedule kept by the control plane, by name."""

    def __init__(self, client: ControlClient, name: str) -> None:
        from gpulayer.sdk.schedule_client import ScheduleClient

        self._client = client
        self._schedules = ScheduleClient(client)
        self.name = name

    def __repr__(self) -> str:
        return f"Schedule({self.name!r})"

    def status(self) -> dict[str, Any]:
        """As `gpulayer schedule show --json` prints it."""
        return self._schedules.show(self.name)

    def pause(self) -> dict[str, Any]:
        return self._schedules.action(self.name, "pause")

    def resume(self) -> dict[str, Any]:
        return self._schedules.action(self.name, "resume")

    def delete(self) -> dict[str, Any]:
        return self._schedules.delete(self.name)

    def trigger(self) -> Job:
        """Run one now, outside the cron (concurrency and budget still apply)."""
        answer = self._schedules.action(self.name, "trigger")
        if answer.get("job_id") is None:
            raise ScheduleSkipped(str(answer.get("skipped")), str(answer.get("message")))
        return Job(self._client, answer["job_id"])

    def runs(self, limit: int = 50) -> list[dict[str, Any]]:
        """Newest first: each tick with its job id and state, or why it was skipped."""
        return self._schedules.runs(self.name, limit=limit)

    def jobs(self, limit: int = 50) -> list[Job]:
        return [Job(self._client, r["job_id"]) for r in self.runs(limit) if r["job_id"]]

    def next_ticks(self, n: int = 5) -> list[datetime]:
        """The next n ticks from now, in the schedule's timezone."""
        from gpulayer.schedules.model import Schedule as ScheduleModel
        from gpulayer.schedules.ticks import next_ticks, zone

        model = ScheduleModel.model_validate(self.status()["spec"])
        tz = zone(model.timezone)
        start = datetime.fromtimestamp(time.time()).astimezone(tz)
        return [t.astimezone(tz) for t in next_ticks(model.expressions, tz, start, n)]
