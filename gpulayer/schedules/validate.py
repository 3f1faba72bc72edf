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
    document = Schedule.model_json_schema()
    document["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return document
