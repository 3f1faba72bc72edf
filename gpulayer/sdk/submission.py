"""Hand a job to the control plane, with its source: a folder (local) or a bundle (server)."""

from __future__ import annotations

import os
import tempfile
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
    workload = job.get("workload") if isinstance(job.get("workload"), dict) else None
    source = workload.get("source") if workload else None
    if isinstance(source, str) and not Path(source).is_dir():
        raise UsageError(f"workload.source: {source!r} is not a directory")
    if connection.embedded:
        return {
            "working_dir": os.getcwd() if source is None else None,
            "source_dir": source if isinstance(source, str) else None,
        }
    bundle_id, warning = _uploaded_bundle(
        connection, Path(source) if isinstance(source, str) else Path.cwd()
    )
    if warning and warnings is not None:
        warnings.append(warning)
    return {"bundle_id": bundle_id}


def _uploaded_bundle(connection: Connection, source: Path) -> tuple[str, str | None]:
    from gpulayer.control.paths import home
    from gpulayer.protocol.bundle import bundle_warning, create_bundle

    with tempfile.TemporaryDirectory(prefix="gpulayer-bundle-") as scratch:
        bundle = Path(scratch) / "source.tar.gz"
        info = create_bundle(source, bundle, exclude=[home().root])
        bundle_id = connection.client.upload_bundle(bundle)
    return bundle_id, bundle_warning(info)


def send_job(connection: Connection, data: dict[str, Any]) -> dict[str, Any]:
    """Submit spec data; sources are handed over as a directory (local) or a bundle (server)."""
    warnings: list[str] = []
    fields = source_fields(connection, data, warnings)
    if connection.embedded:
        fields["client_env"] = dict(os.environ)
    job = connection.client.submit(data, **fields)
    if warnings:
        job.setdefault("warnings", []).extend(warnings)
    return job
