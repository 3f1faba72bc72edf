"""`@gl.remote(...)`: call a function here as usual, or `.remote(...)` it as a function job.

A function defined in the script being run (`python app.py`) lives in `__main__`; the job
imports it as the script's own module name, with the script's folder shipped as the source.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from gpulayer.errors import UsageError
from gpulayer.sdk.builders import JobBuilder, ensure_json
from gpulayer.sdk.job import Job

if TYPE_CHECKING:
    from gpulayer.sdk.schedule import Schedule

R = TypeVar("R")


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


class RemoteFunction(Generic[R]):
    def __init__(
        self, fn: Callable[..., R], options: dict[str, Any], server: str | None = None
    ) -> None:
        self._fn = fn
        self._options = options
        self._server = server
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        return self._fn(*args, **kwargs)

    def builder(self, *args: Any, **kwargs: Any) -> JobBuilder:
        return function_job(self._fn, args, kwargs).override(**self._options)

    def remote(self, *args: Any, **kwargs: Any) -> Job:
        """Run as a function job with these (JSON) arguments; returns the Job at once."""
        from gpulayer.sdk.launch import launch

        return launch(self.builder(*args, **kwargs), server=self._server)

    def schedule(self, cron: Any, *args: Any, name: str | None = None, **kwargs: Any) -> Schedule:
        """Run as a function job with these arguments on a cron (a string, a list or a
        gl.Cron); keywords named like schedule fields (timezone, concurrency, budget,
        catch_up, ...) set those, the rest go to the function."""
        from gpulayer.sdk.schedule import SCHEDULE_OPTIONS, schedule

        options = {k: kwargs.pop(k) for k in list(kwargs) if k in SCHEDULE_OPTIONS}
        builder = self.builder(*args, **kwargs)
        return schedule(
            builder,
            name=name or self._fn.__name__[:63].strip("_") or "function",
            cron=cron,
            server=self._server,
            **options,
        )

    def options(self, **overrides: Any) -> RemoteFunction[R]:
        """A copy with some options changed, e.g. f.options(gpus=4).remote(...)."""
        merged = {**self._options, **overrides}
        JobBuilder({"kind": "function", "entrypoint": "m:f"}).override(**merged).spec()
        return RemoteFunction(self._fn, merged, self._server)


def remote(
    fn: Callable[..., R] | None = None, **options: Any
) -> RemoteFunction[R] | Callable[[Callable[..., R]], RemoteFunction[R]]:
    """Decorate a function so `f.remote(...)` runs it as a job.

    Options use the builders' short names: profile, gpus, accelerator, target, fallback,
    max_hourly_cost, env, timeout, retry, name, worker_labels, ...
    """
    server = options.pop("server", None)
    # Bad options fail where the decorator is written, not at the first .remote() call.
    JobBuilder({"kind": "function", "entrypoint": "m:f"}).override(**options).spec()

    def wrap(inner: Callable[..., R]) -> RemoteFunction[R]:
        return RemoteFunction(inner, options, server)

    return wrap(fn) if fn is not None else wrap
