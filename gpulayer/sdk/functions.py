"""A plain module-level function as a function job: where a worker imports it from, and the
builder that runs it with given arguments. Used by launch(), @remote and the Trainer."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from gpulayer.errors import UsageError
from gpulayer.sdk.builders import JobBuilder, ensure_json


@runtime_checkable
class BuildsJob(Protocol):
    """Something that makes the job for a call with these arguments (a @remote function)."""

    def builder(self, *args: Any, **kwargs: Any) -> JobBuilder: ...


def function_location(fn: Callable[..., Any]) -> tuple[str, str]:
    """(entrypoint "module:qualname", source folder) that let a worker import fn."""
    qualname = getattr(fn, "__qualname__", "")
    if not qualname or "<locals>" in qualname or "<lambda>" in qualname:
        raise UsageError(
            f"{getattr(fn, '__name__', fn)!r}: only module-level functions can run as jobs"
        )
    module_name = fn.__module__
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    if not file:
        raise UsageError(f"{qualname}: its module {module_name!r} has no file to ship")
    path = Path(file).resolve()
    if module_name == "__main__":
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.name and spec.name != "__main__":
            module_name = spec.name  # run with python -m package.module
        else:
            module_name = path.stem
    if not all(part.isidentifier() for part in module_name.split(".")):
        raise UsageError(f"{qualname}: {path.name} is not importable as a module")
    root = path.parent
    for _ in range(module_name.count(".") + (1 if path.name == "__init__.py" else 0)):
        root = root.parent
    return f"{module_name}:{qualname}", str(root)


def function_job(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> JobBuilder:
    entrypoint, source = function_location(fn)
    ensure_json(list(args), f"{fn.__name__}() arguments")
    ensure_json(kwargs, f"{fn.__name__}() keyword arguments")
    workload = {
        "kind": "function",
        "entrypoint": entrypoint,
        "args": list(args),
        "kwargs": kwargs,
        "source": source,
    }
    return JobBuilder(workload).name(fn.__name__[:63].strip("_") or "function")
