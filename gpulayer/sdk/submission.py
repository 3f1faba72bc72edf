"""Hand a job to the control plane, with its source: a folder (local) or a bundle (server)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from gpulayer.control.connect import Connection
from gpulayer.errors import UsageError


def send_job(connection: Connection, data: dict[str, Any]) -> dict[str, Any]:
    """Submit spec data; sources are handed over as a directory (local) or a bundle (server)."""
    workload = data.get("workload") if isinstance(data.get("workload"), dict) else None
    source = workload.get("source") if workload else None
    if isinstance(source, str) and not Path(source).is_dir():
        raise UsageError(f"workload.source: {source!r} is not a directory")
    client = connection.client
    if connection.embedded:
        return client.submit(
            data,
            working_dir=os.getcwd() if source is None else None,
            source_dir=source if isinstance(source, str) else None,
            client_env=dict(os.environ),
        )
    from gpulayer.control.paths import home
    from gpulayer.worker.bundle import bundle_warning, create_bundle

    with tempfile.TemporaryDirectory(prefix="gpulayer-bundle-") as scratch:
        bundle = Path(scratch) / "source.tar.gz"
        info = create_bundle(
            Path(source) if isinstance(source, str) else Path.cwd(),
            bundle,
            exclude=[home().root],
        )
        bundle_id = client.upload_bundle(bundle)
    job = client.submit(data, bundle_id=bundle_id)
    warning = bundle_warning(info)
    if warning:
        job.setdefault("warnings", []).append(warning)
    return job
