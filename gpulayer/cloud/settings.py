"""Validate a provider's settings mapping into its pydantic model, with errors that name the
field, so every plugin reports bad configuration the same way."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping, Sequence
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
        problems = settings_problems(model, exc)
        raise ProviderSettingsError(f"settings: {'; '.join(problems)}", provider=provider) from None


def settings_problems(model: type[BaseModel], error: ValidationError) -> list[str]:
    """One ``path: message`` per problem; an unknown key gets the closest valid one."""
    from gpulayer.spec.errors import is_type_error, type_message

    problems = []
    for item in error.errors(include_url=False):
        where = ".".join(str(part) for part in item["loc"]) or "(settings)"
        message = str(item["msg"]).removeprefix("Value error, ")
        if is_type_error(item):
            message = type_message(item)
        elif item["type"] == "extra_forbidden":
            message = "unknown setting" + closest_hint(
                str(item["loc"][-1]), keys_at(model, item["loc"][:-1])
            )
        problems.append(f"{where}: {message}")
    return problems


def closest_hint(given: str, valid: Sequence[str]) -> str:
    """``; did you mean 'regions'?`` when a valid key is close to the one written."""
    found = difflib.get_close_matches(given, list(valid), n=1, cutoff=0.6)
    if found:
        return f"; did you mean {found[0]!r}?"
    return f"; valid: {', '.join(sorted(valid))}" if valid else ""


def keys_at(model: type[BaseModel], loc: Sequence[int | str]) -> list[str]:
    """The field names of the model found at ``loc`` inside ``model`` (through lists, dicts and
    optional fields); empty when the path leads to no model."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or not _is_model(current):
            current = _item_type(current)
            continue
        field = current.model_fields.get(part)
        if field is None:
            return []
        current = field.annotation
        current = _model_in(current) or current
    found = _model_in(current)
    return list(found.model_fields) if found else []


def _is_model(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, BaseModel)


def _model_in(kind: Any) -> type[BaseModel] | None:
    """The model a field holds directly or as ``X | None``."""
    if _is_model(kind):
        return typing.cast(type[BaseModel], kind)
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        for arg in typing.get_args(kind):
            found = _model_in(arg)
            if found:
                return found
    return None


def _item_type(kind: Any) -> Any:
    """What a list or dict holds (the model inside, if one)."""
    for arg in reversed(typing.get_args(kind)):
        found = _model_in(arg) or _model_in(_item_type(arg))
        if found:
            return found
    return None
