"""`@gl.remote(...)`: call a function here as usual, or `.remote(...)` it as a function job.

A function defined in the script being run (`python app.py`) lives in `__main__`; the job
imports it as the script's own module name, with the script's folder shipped as the source.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from gpulayer.sdk.builders import JobBuilder
from gpulayer.sdk.functions import function_job
from gpulayer.sdk.job import Job, JobFailed

if TYPE_CHECKING:
    from gpulayer.sdk.schedule import Schedule

R = TypeVar("R")


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

    def map(self, items: Iterable[Any], *, timeout: float | None = None) -> list[Any]:
        """One function job per item (the item is its one argument), all submitted in one
        request, like Modal's ``.map()``; their results, in the items' order. A failed job
        raises JobFailed once every job has been waited for."""
        from gpulayer.sdk.launch import launch_many
        from gpulayer.sdk.waiting import wait_all

        builders = [self.builder(item) for item in items]
        jobs = launch_many(builders, server=self._server)
        if not jobs:
            return []
        ended = wait_all(jobs[0].client, [job.id for job in jobs], timeout)
        for status in ended:
            if status["state"] != "succeeded":
                raise JobFailed(status)
        return [status.get("result") for status in ended]

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
