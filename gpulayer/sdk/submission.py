"""Hand a job to the control plane, with its source: a folder (local) or a bundle (server)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpulayer.errors import UsageError
from gpulayer.sdk.connection import Connection


def source_fields(
    connection: Connection, job: dict[str, Any], warnings: list[str] | None = None
) -> dict[str, Any]:
    """How the job's source travels: a directory the local control plane reads (or the
    current one to run in), or a bundle uploaded to a server. Keyword arguments of submit.
    A line about files that changed while bundling goes to ``warnings``."""
    source = _source_folder(job)
    if connection.embedded:
        return {
            "working_dir": os.getcwd() if source is None else None,
            "source_dir": source,
        }
    bundle_id, warning = _uploaded_bundle(
        connection, Path(source) if source is not None else Path.cwd(), _local_inputs(job)
    )
    if warning and warnings is not None:
        warnings.append(warning)
    return {"bundle_id": bundle_id}


def _source_folder(job: dict[str, Any]) -> str | None:
    """The job's workload.source folder, None for the current one."""
    workload = job.get("workload") if isinstance(job.get("workload"), dict) else None
    source = workload.get("source") if workload else None
    if isinstance(source, str) and not Path(source).is_dir():
        raise UsageError(f"workload.source: {source!r} is not a directory")
    return source if isinstance(source, str) else None


def _local_inputs(job: dict[str, Any]) -> dict[int, Path]:
    """The job's inputs (by index) that are files or folders of this machine: its bundle
    carries them, since a worker elsewhere cannot read them where they lie."""
    from gpulayer.protocol.bundle import local_input_paths

    inputs = job.get("inputs")
    artifacts = [
        i.get("artifact") if isinstance(i, dict) else None
        for i in (inputs if isinstance(inputs, list) else [])
    ]
    # An artifact that is not a non-empty string names no file here ("" read as a path would
    # be the current folder, shipped whole): the control plane refuses it instead.
    named = [a if isinstance(a, str) and a else "job:" for a in artifacts]
    return local_input_paths(named, Path.cwd())


@contextlib.contextmanager
def _bundle_of(source: Path, inputs: dict[int, Path]) -> Iterator[tuple[Path, str, str | None]]:
    """The source and local inputs bundled in a scratch folder, while the block runs: the
    bundle's path, its sha256 and a warning about files that changed while bundling."""
    from gpulayer.control.paths import home
    from gpulayer.protocol.bundle import bundle_warning, create_bundle

    with tempfile.TemporaryDirectory(prefix="gpulayer-bundle-") as scratch:
        bundle = Path(scratch) / "source.tar.gz"
        info = create_bundle(source, bundle, exclude=[home().root], inputs=inputs)
        yield bundle, info.sha256, bundle_warning(info)


def _uploaded_bundle(
    connection: Connection, source: Path, inputs: dict[int, Path]
) -> tuple[str, str | None]:
    """The source and local inputs as a bundle the server keeps: asked for by digest first,
    uploaded only when the server lacks it (the same source submitted again costs one small
    request)."""
    with _bundle_of(source, inputs) as (bundle, digest, warning):
        bundle_id = connection.client.kept_bundle(digest)
        if bundle_id is None:
            bundle_id = connection.client.upload_bundle(bundle)
    return bundle_id, warning


def send_jobs(connection: Connection, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Submit several jobs' spec data in one request (one transaction on a server); jobs
    whose bundles would hold the same things (source folder and local inputs) share one,
    bundled and uploaded once. Their views, in order."""
    warnings: list[str] = []
    by_contents: dict[Any, dict[str, Any]] = {}
    bodies = []
    # The local control plane runs a job without a source folder in the current one, and
    # gives each job the environment it was submitted from.
    local = {"client_env": dict(os.environ)} if connection.embedded else {}
    if local and _list_size(jobs, local) > _LIST_BUDGET:
        return [send_job(connection, data) for data in jobs]  # each its own request
    for data in jobs:
        # Each job's local inputs travel inside its bundle: a bundle made for another job's
        # inputs would hand this one the wrong files.
        inputs = tuple(sorted((index, str(path)) for index, path in _local_inputs(data).items()))
        key = (_source_folder(data), inputs)
        if key not in by_contents:
            if connection.embedded and key[0] is None:
                by_contents[key] = {"working_dir": os.getcwd()}
            else:
                bundle_id, warning = _uploaded_bundle(
                    connection, Path(key[0] or os.getcwd()), _local_inputs(data)
                )
                warnings.extend([warning] if warning else [])
                by_contents[key] = {"bundle_id": bundle_id}
        bodies.append({"spec": data, **by_contents[key], **local})
    views = connection.client.submit_many(bodies)
    if warnings and views:
        views[0].setdefault("warnings", []).extend(warnings)
    return views


# Inside the control plane's 32 MiB cap on a POST /v1/jobs body, with room for the bundles'
# ids and the JSON around each job.
_LIST_BUDGET = 24 << 20


def _list_size(jobs: list[dict[str, Any]], extra: dict[str, Any]) -> int:
    """About how many bytes a list of these jobs takes as JSON, ``extra`` in each."""
    import json

    each = len(json.dumps(extra, default=str)) + 256
    return sum(len(json.dumps(data, default=str)) + each for data in jobs)


def send_job(connection: Connection, data: dict[str, Any]) -> dict[str, Any]:
    """Submit spec data; sources are handed over as a directory (local) or a bundle (server)."""
    warnings: list[str] = []
    if connection.embedded:
        fields = source_fields(connection, data, warnings)
        fields["client_env"] = dict(os.environ)
        job = connection.client.submit(data, **fields)
    else:
        job = _submit_with_bundle(connection, data, warnings)
    if warnings:
        job.setdefault("warnings", []).extend(warnings)
    return job


def _submit_with_bundle(
    connection: Connection, data: dict[str, Any], warnings: list[str]
) -> dict[str, Any]:
    """One request when the server keeps the job's bundle already (the same source sent
    again): the job names the bundle by digest, and only a server that lacks it has it
    uploaded, after which the job is sent again."""
    from gpulayer.errors import BundleNotKeptError

    source = _source_folder(data)
    folder = Path(source) if source is not None else Path.cwd()
    with _bundle_of(folder, _local_inputs(data)) as (bundle, digest, warning):
        if warning:
            warnings.append(warning)
        try:
            return connection.client.submit(data, bundle_id=f"sha256:{digest}")
        except BundleNotKeptError:
            bundle_id = connection.client.upload_bundle(bundle)
        return connection.client.submit(data, bundle_id=bundle_id)
