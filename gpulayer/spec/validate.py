"""Validate plain data into a JobSpec, raising SpecError with one line per problem."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from gpulayer.errors import SpecError
from gpulayer.spec.errors import error_lines
from gpulayer.spec.models import JobSpec


def validate_spec(data: Any) -> JobSpec:
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(error_lines(exc)) from None
