"""docs/settings.md, generated from the settings models so that every key is documented once.

Regenerate with ``python -m gpulayer.cli.settings_doc --write docs/settings.md``; a test fails
when the page in the tree is stale.
"""

from __future__ import annotations

import json
import sys
import types
import typing
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from gpulayer.errors import GpulayerError

INTRO = """\
# Settings

Generated from the settings models by `python -m gpulayer.cli.settings_doc --write
docs/settings.md`; do not edit by hand.

`providers.yaml` in the gpulayer home (`GPULAYER_PROVIDERS_FILE` moves it) enables a provider by
naming it and holds its settings; the `gpulayer:` section holds the orchestrator's own. Every
provider's section also takes `idle_seconds` (as the `gpulayer:` section's, which it overrides
for that provider's machines).
`gpulayer config check` validates the file whole (unknown keys are refused, with the closest
valid one) and `gpulayer config show` prints it with every default filled in. A job that may go
to a cloud is refused at submit (exit 2, no job made) while the file does not validate.
"""


class UndocumentedSection(GpulayerError):
    """A plugin shipped in this tree whose settings cannot be read: the page would silently
    lack its providers.yaml section."""


def documented_plugins() -> list[str]:
    """Every provider plugin shipped in this source tree, sorted: each one is a section."""
    shipped = Path(__file__).resolve().parents[2] / "providers"
    return sorted(p.parent.name for p in shipped.glob("*/pyproject.toml"))


def _settings_model(name: str) -> type[BaseModel] | None:
    from gpulayer.cloud.registry import settings_model

    model = settings_model(name)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def render_page() -> str:
    from gpulayer.cloud.orchestrator_settings import OrchestratorSettings

    parts = [INTRO]
    parts.append(_section("gpulayer", OrchestratorSettings, "The orchestrator's own settings."))
    parts.append(_fleets_section())
    for name in documented_plugins():
        model = _settings_model(name)
        if model is None:
            raise UndocumentedSection(
                f"provider {name!r}: no settings model (not installed here, or its provider "
                "class names no settings_model); its section cannot be written"
            )
        text = model.__doc__ or sys.modules[model.__module__].__doc__ or ""
        summary = text.strip().split("\n\n")[0]
        parts.append(_section(name, model, " ".join(summary.split())))
    from gpulayer.control.environment import environment_section

    parts.append(environment_section())
    return "\n".join(parts).rstrip() + "\n"


def _fleets_section() -> str:
    from gpulayer.cloud.config import fleet_settings_model

    summary = (
        "A list of named fleets of warm machines, each kept by the configuration rather than "
        "by a job (see docs/clouds.md, Fleets). `resources` takes a job's `resources` keys "
        "(JOBSPEC.md). Each entry:"
    )
    return _section("fleets", fleet_settings_model(), summary)


def _section(name: str, model: type[BaseModel], summary: str) -> str:
    lines = [f"## `{name}:`", ""]
    if summary:
        lines += [summary, ""]
    lines += _tables(name, model)
    return "\n".join(lines)


def _tables(prefix: str, model: type[BaseModel]) -> list[str]:
    lines = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    nested: list[tuple[str, type[BaseModel]]] = []
    for key, info in model.model_fields.items():
        inner = _model_inside(info.annotation)
        if inner is not None and inner.__module__.startswith("gpulayer.spec"):
            inner = None  # a JobSpec model: its reference is JOBSPEC.md
        if inner is not None:
            origin = typing.get_origin(_unannotated(info.annotation))
            suffix = {list: "[]", dict: ".NAME"}.get(origin, "")
            nested.append((f"{prefix}.{key}{suffix}", inner))
        meaning = " ".join((info.description or "").split()).replace("|", "\\|")
        kind = _type_name(info.annotation)
        if inner is None and kind == "mapping (below)":
            kind = "mapping"
        lines.append(f"| `{key}` | {kind} | {_default(info)} | {meaning} |")
    lines.append("")
    for path, inner in nested:
        lines += [f"### `{path}`", ""]
        lines += _tables(path, inner)
    return lines


def _default(info: Any) -> str:
    if info.is_required():
        return "required"
    value = info.default_factory() if info.default_factory is not None else info.default
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", exclude_unset=True)
    return f"`{json.dumps(value)}`"


def _strip_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _unannotated(annotation: Any) -> Any:
    kind = _strip_optional(annotation)
    if typing.get_origin(kind) is typing.Annotated:
        kind = typing.get_args(kind)[0]
    return kind


def _model_inside(annotation: Any) -> type[BaseModel] | None:
    """The model of a field that is one, or a list of them, or a map of names to them."""
    kind = _unannotated(annotation)
    if typing.get_origin(kind) is list:
        kind = typing.get_args(kind)[0]
    elif typing.get_origin(kind) is dict:
        kind = typing.get_args(kind)[1]
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return kind
    return None


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        optional = " or null" if type(None) in args else ""
        return " or ".join(names) + optional
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"map of {_type_name(args[0])} to {_type_name(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping (below)"
    simple: dict[Any, str] = {
        str: "string",
        int: "integer",
        float: "number",
        bool: "boolean",
        Path: "path",
    }
    if annotation in simple:
        return simple[annotation]
    if annotation is typing.Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    page = render_page()
    if len(args) == 2 and args[0] == "--write":
        Path(args[1]).write_text(page)
        return 0
    if args:
        print("usage: python -m gpulayer.cli.settings_doc [--write PATH]", file=sys.stderr)
        return 2
    sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
