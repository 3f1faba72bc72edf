"""Validate a provider's settings mapping into its pydantic model, with errors that name the
field, so every plugin reports bad configuration the same way."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ValidationError

from gpulayer.cloud.errors import ProviderSettingsError

M = TypeVar("M", bound=BaseModel)


def check_python(value: str | None) -> str | None:
    """A provider's ``python`` setting: the interpreter the worker bootstrap runs on
    instances, one word (it goes into a shell command line)."""
    if value is not None and (not value or any(c.isspace() or c in "\0'\"" for c in value)):
        raise ValueError(f"{value!r} must be one non-empty word")
    return value


def check_install_root(value: str | None) -> str | None:
    """A provider's ``install_root`` setting, without its trailing slash."""
    if value is None:
        return None
    from gpulayer.cloud.bootstrap import install_dir_problem

    value = value.rstrip("/") or "/"
    # The root itself is never removed, but every job dir below it must be removable.
    problem = install_dir_problem(f"{value}/job")
    if problem is not None:
        raise ValueError(f"job directories below {value!r}: {problem}")
    return value


PythonSetting = Annotated[str | None, AfterValidator(check_python)]
"""Type of a provider's ``python`` setting."""
InstallRootSetting = Annotated[str | None, AfterValidator(check_install_root)]
"""Type of a provider's ``install_root`` setting."""


def load_settings(model: type[M], data: M | Mapping[str, Any] | None, *, provider: str) -> M:
    if isinstance(data, model):
        return data
    try:
        return model.model_validate(dict(data or {}))
    except ValidationError as exc:
        problems = []
        for item in exc.errors(include_url=False):
            where = ".".join(str(part) for part in item["loc"]) or "(settings)"
            message = str(item["msg"]).removeprefix("Value error, ")
            if item["type"] == "extra_forbidden":
                message = "unknown setting"
            problems.append(f"{where}: {message}")
        raise ProviderSettingsError(f"settings: {'; '.join(problems)}", provider=provider) from None
