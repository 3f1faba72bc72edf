"""Turn pydantic errors into one line per problem, each naming the field path."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import ValidationError

_WORKLOAD_KINDS = frozenset({"command", "function", "distributed"})
_FIELD_PREFIX = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*): (.*)$", re.S)
_FRIENDLY = {
    "extra_forbidden": "unknown field",
    "missing": "required field is missing",
    "union_tag_invalid": "unknown kind; expected one of command, function, distributed",
    "union_tag_not_found": "kind is required (command, function or distributed)",
}


_STRICT_TYPES = {
    "int_type": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "bool_type": "a boolean",
}


def _described(value: Any) -> str:
    """What was written, with its type, since `"2"` and `2` print alike in YAML."""
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, str):
        return f"{value!r} (a string)"
    if isinstance(value, (int, float)):
        return f"{value!r} (a number)"
    if value is None:
        return "null"
    return f"a {type(value).__name__}"


def type_message(item: Any) -> str:
    """``'2' (a string) is not an integer`` for a pydantic type error item."""
    return f"{_described(item['input'])} is not {_STRICT_TYPES[item['type']]}"


def is_type_error(item: Any) -> bool:
    return item["type"] in _STRICT_TYPES


def _path(loc: tuple[Any, ...]) -> list[str]:
    parts = [str(p) for p in loc]
    # A discriminated union puts the chosen tag in the location: workload.command.command.
    # A schedule holds its JobSpec under job: job.workload.command.command.
    at = 1 if parts[:1] == ["job"] else 0
    if len(parts) >= at + 2 and parts[at] == "workload" and parts[at + 1] in _WORKLOAD_KINDS:
        del parts[at + 1]
    return parts


def error_lines(error: ValidationError) -> list[str]:
    lines = []
    for item in error.errors(include_url=False):
        parts = _path(item["loc"])
        message = _FRIENDLY.get(item["type"], item["msg"])
        if item["type"] == "value_error":
            message = message.removeprefix("Value error, ")
            match = _FIELD_PREFIX.match(message)
            if match:
                parts.append(match.group(1))
                message = match.group(2)
        elif item["type"] in _STRICT_TYPES:
            message = type_message(item)
        elif item["type"] == "literal_error":
            message = f"{item['input']!r} is not allowed; {message[0].lower()}{message[1:]}"
        lines.append(f"{'.'.join(parts) or '(spec)'}: {message}")
    return lines
