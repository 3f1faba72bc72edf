"""`gl.launch(...)`: submit a spec, a builder, a job file's data or a function; get a Job."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from gpulayer.errors import SpecError, UsageError
from gpulayer.sdk.builders import JobBuilder
from gpulayer.sdk.job import Job


def _builder_for(what: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> JobBuilder:
    from gpulayer.sdk.functions import BuildsJob, function_job

    if isinstance(what, JobBuilder):
        return what
    if isinstance(what, dict):
        # Before the protocol check below, which costs a scan of the protocol's members.
        builder = JobBuilder({})
        builder._data = dict(what)
        return builder
    if isinstance(what, BuildsJob):
        return what.builder(*args, **kwargs)
    if callable(what) and not isinstance(what, type):
        return function_job(what, args, kwargs)
    from gpulayer.spec import JobSpec

    if isinstance(what, JobSpec):
        builder = JobBuilder({})
        builder._data = what.model_dump(mode="json", exclude_defaults=True)
        builder._data.setdefault("workload", what.workload.model_dump(mode="json"))
        return builder
    raise UsageError(
        f"launch: expected a JobSpec, a builder, a dict or a function, not {type(what).__name__}"
    )


def launch(
    what: JobBuilder | Callable[..., Any] | dict[str, Any] | Any,
    *args: Any,
    server: str | None = None,
    **overrides: Any,
) -> Job:
    """Submit a job and return its handle at once (it runs in the background).

    `what` is a JobSpec, a builder, spec data, or a function (then args go to it). Keyword
    overrides use the builders' short names: gpus=2, target="remote", max_hourly_cost=4, ...
    For a function, keyword arguments that are not spec fields go to the function.
    """
    from gpulayer.sdk.connection import connect
    from gpulayer.sdk.submission import send_job

    data = job_data(what, args, overrides)
    connection = connect(server)
    job = send_job(connection, data)
    for warning in job.get("warnings", []):
        warnings.warn(warning, stacklevel=2)
    return Job(connection.client, job["id"])


def launch_many(
    specs: Iterable[JobBuilder | dict[str, Any] | Any],
    *,
    server: str | None = None,
    **overrides: Any,
) -> list[Job]:
    """Submit many jobs in one request (one transaction on a server); their handles, in
    order. Each item is what launch() takes but a function with arguments (use a builder or
    ``fn.map``); ``overrides`` apply to every one. Bad input in any refuses all of them."""
    from gpulayer.sdk.connection import connect
    from gpulayer.sdk.submission import send_jobs

    datas = []
    for index, what in enumerate(specs):
        try:
            datas.append(job_data(what, (), dict(overrides)))
        except SpecError as exc:
            raise SpecError([f"specs[{index}].{line}" for line in exc.lines]) from None
    if not datas:
        return []
    connection = connect(server)
    views = send_jobs(connection, datas)
    for warning in views[0].get("warnings", []) if views else []:
        warnings.warn(warning, stacklevel=2)
    return [Job(connection.client, view["id"]) for view in views]


def job_data(what: Any, args: tuple[Any, ...], overrides: dict[str, Any]) -> dict[str, Any]:
    """The spec data launch() would submit: validated (SpecError names the field), with
    relative paths made absolute against the current directory."""
    from gpulayer.sdk.builders import PLACEMENT_KEYS as _PLACEMENT
    from gpulayer.sdk.builders import RESOURCE_ALIASES, RESOURCE_KEYS, TOP_KEYS
    from gpulayer.spec.validate import validate_spec

    call_kwargs: dict[str, Any] = {}
    if callable(what) and not isinstance(what, (JobBuilder, type, dict)):
        spec_names = (
            RESOURCE_KEYS
            | _PLACEMENT
            | TOP_KEYS
            | set(RESOURCE_ALIASES)
            | {"timeout", "source", "fallback"}
        )
        call_kwargs = {k: v for k, v in overrides.items() if k not in spec_names}
        overrides = {k: v for k, v in overrides.items() if k in spec_names}
    builder = _builder_for(what, args, call_kwargs)
    builder.override(**overrides)
    data = builder.to_dict()
    validate_spec(data)  # bad input fails here, in the caller, naming the field
    _absolutize(data)
    return data


def _absolutize(data: dict[str, Any]) -> None:
    from gpulayer.sdk.paths import absolutize_paths

    absolutize_paths(data, os.getcwd())
