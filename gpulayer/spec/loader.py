"""Read job files (JSON or YAML) into plain data; validation is the models' job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpulayer.errors import UsageError


def load_spec_data(path: str | Path) -> dict[str, Any]:
    """Parse a JSON or YAML job file. Raises UsageError naming the file on any problem."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--file: cannot read {str(file)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--file: {str(file)!r} is not UTF-8 text") from None
    is_yaml = file.suffix.lower() in (".yaml", ".yml")
    return parse_spec_text(text, yaml_first=is_yaml, name=file.name)


def parse_spec_text(text: str, *, yaml_first: bool = False, name: str = "spec") -> dict[str, Any]:
    data: Any
    if yaml_first:
        data = _parse_yaml(text, name)
    else:
        try:
            data = json.loads(text)
        except ValueError as json_error:
            # YAML is a superset of JSON, so a file that is neither gets the JSON error,
            # which is the more precise one for a .json file.
            try:
                data = _parse_yaml(text, name)
            except UsageError:
                raise UsageError(f"--file: {name} is not valid JSON: {json_error}") from None
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise UsageError(f"--file: {name} must hold an object (a JobSpec), not {kind}")
    return data


def _parse_yaml(text: str, name: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        problem = getattr(exc, "problem", None) or exc
        raise UsageError(f"--file: {name} is not valid YAML{at}: {problem}") from None
