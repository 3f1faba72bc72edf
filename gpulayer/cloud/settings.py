"""Validate a provider's settings mapping into its pydantic model, with errors that name the
field, so every plugin reports bad configuration the same way."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gpulayer.cloud.errors import ProviderSettingsError

M = TypeVar("M", bound=BaseModel)


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
