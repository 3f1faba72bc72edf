"""The Schedule contract (gpulayer.dev/v1alpha1, SCHEDULE.md) as pydantic models. Pure.

Rules spanning fields raise ``ValueError("field: message")`` so that the error lines name the
field path, as for a JobSpec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from gpulayer.schedules.ticks import CronError, check_expression, zone
from gpulayer.spec.currency import CurrencyCode
from gpulayer.spec.models import (
    API_VERSION,
    DistributedWorkload,
    JobSpec,
    Provisioning,
    StrictModel,
    check_name,
)

Concurrency = Literal["allow", "forbid", "replace"]
CatchUp = Literal["none", "latest"]
Period = Literal["day", "week", "month"]
SKIP_REASONS = ("concurrency", "suspended", "deadline", "budget_exhausted", "catch_up")

SCHEDULE_LABEL = "gpulayer.dev/schedule"
TICK_LABEL = "gpulayer.dev/tick"


@dataclass(frozen=True)
class Cron:
    """A cron written with its timezone, as `gl.Cron("0 4 * * *", timezone="Europe/Berlin")`."""

    expression: str | tuple[str, ...]
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        if isinstance(self.expression, list):
            object.__setattr__(self, "expression", tuple(self.expression))


class Budget(StrictModel):
    max_cost: Annotated[float, Field(gt=0)]
    currency: CurrencyCode = "USD"
    period: Period = "month"


class Schedule(StrictModel):
    api_version: Literal["gpulayer.dev/v1alpha1"] = API_VERSION
    name: str
    cron: str | list[str]
    timezone: str = "UTC"
    job: JobSpec
    concurrency: Concurrency = "forbid"
    catch_up: CatchUp = "latest"
    starting_deadline_seconds: Annotated[float, Field(gt=0)] | None = None
    suspend: bool = False
    budget: Budget | None = None
    history_limit: Annotated[int, Field(ge=0)] = 50

    @model_validator(mode="before")
    @classmethod
    def _job_named_after_schedule(cls, data: Any) -> Any:
        # A job that names nothing is named after its schedule, so `gpulayer ls` tells runs apart.
        if isinstance(data, dict) and isinstance(data.get("job"), dict):
            job = data["job"]
            if "name" not in job and isinstance(data.get("name"), str):
                data = {**data, "job": {**job, "name": data["name"]}}
        return data

    @field_validator("name")
    @classmethod
    def _name_form(cls, name: str) -> str:
        return check_name(name)

    @field_validator("cron")
    @classmethod
    def _cron_form(cls, cron: str | list[str]) -> str | list[str]:
        expressions = [cron] if isinstance(cron, str) else cron
        if not expressions:
            raise ValueError("give at least one expression")
        try:
            normalized = [check_expression(e) for e in expressions]
        except CronError as exc:
            raise ValueError(str(exc)) from None
        return normalized[0] if isinstance(cron, str) else normalized

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, name: str) -> str:
        zone(name)
        return name

    @model_validator(mode="after")
    def _budget_rules(self) -> Schedule:
        if self.budget is None or not can_rent(self.job):
            return self
        placement = self.job.placement
        if placement.max_hourly_cost is None:
            raise ValueError(
                "job.placement.max_hourly_cost: required with a budget when the job may rent "
                "machines (it bounds a run's worst case)"
            )
        if self.job.timeout_seconds is None:
            raise ValueError(
                "job.timeout_seconds: required with a budget when the job may rent machines "
                "(it bounds a run's worst case)"
            )
        if placement.currency != self.budget.currency:
            raise ValueError(
                f"budget.currency: {self.budget.currency} differs from the job's "
                f"placement.currency {placement.currency}"
            )
        return self

    @property
    def expressions(self) -> tuple[str, ...]:
        return (self.cron,) if isinstance(self.cron, str) else tuple(self.cron)


def can_rent(job: JobSpec) -> bool:
    return "cloud" in job.placement.targets


def node_count(job: JobSpec) -> int:
    workload = job.workload
    return workload.num_workers if isinstance(workload, DistributedWorkload) else 1


def worst_case_cost(job: JobSpec) -> float:
    """The most one run may cost: every node at the hourly cap, per attempt it may take, for
    the whole timeout plus the provisioning window before it (a rented machine is billed from
    launch, and SSH bootstrap takes part of that window). Local and remote workers cost 0."""
    if not can_rent(job):
        return 0.0
    hourly = job.placement.max_hourly_cost
    timeout = job.timeout_seconds
    if hourly is None or timeout is None:
        return float("inf")
    provisioning = job.placement.provisioning or Provisioning()
    seconds = timeout + provisioning.provisioning_timeout_seconds
    return hourly * seconds / 3600.0 * node_count(job) * job.retry.max_attempts
