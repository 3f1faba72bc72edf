"""Validate plain data into a Schedule, raising SpecError with one line per problem."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from gpulayer.errors import SpecError
from gpulayer.schedules.model import Schedule
from gpulayer.spec.errors import error_lines


def validate_schedule(data: Any) -> Schedule:
    try:
        return Schedule.model_validate(data)
    except ValidationError as exc:
        raise SpecError(error_lines(exc)) from None


def schedule_json_schema() -> dict[str, Any]:
    """The Schedule's JSON Schema, its job read by the JobSpec's published schema (with every
    rule that one adds to pydantic's) and its name by the same exact pattern."""
    from gpulayer.spec.models import NAME
    from gpulayer.spec.schema import DIALECT, jobspec_schema, openapi_keywords_dropped

    document: dict[str, Any] = openapi_keywords_dropped(Schedule.model_json_schema())
    job = jobspec_schema()
    del job["$schema"]
    # The same models give the same definition names: the JobSpec's refined ones replace them.
    document["$defs"].update(job.pop("$defs"))
    document["$defs"]["JobSpec"] = job
    document["properties"]["name"]["pattern"] = NAME.json_pattern
    return {"$schema": DIALECT, **document}
