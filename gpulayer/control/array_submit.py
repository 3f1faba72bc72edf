"""`POST /v1/jobs` with an ``array``: one spec, its indices and an optional limit, made into
the array's jobs by the server (arrays.py), which picks the id, so the array is bound to the
request that made it.

On a team server the jobs are stored in one transaction with the request's idempotency key.
The local control plane reads the submitter's folder for each job (source_dir, working_dir)
as a plain submit does, one job at a time, and keeps the key once all are stored."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpulayer.control.arrays import array_members, new_array_id
from gpulayer.control.bundle_store import DIGEST_PREFIX, parse_digest
from gpulayer.control.store.once_keys import OnceKey
from gpulayer.errors import UsageError

if TYPE_CHECKING:
    from gpulayer.control.service import ControlService
    from gpulayer.control.store import JobRecord


def submit_array(
    service: ControlService,
    spec: dict[str, Any],
    indices: list[int],
    limit: int | None,
    *,
    embedded: bool,
    working_dir: str | None,
    source_dir: str | None,
    bundle_id: str | None,
    client_env: dict[str, str] | None,
    once: OnceKey | None,
) -> list[JobRecord]:
    if len(set(indices)) != len(indices):
        raise UsageError("array.indices: an index is given twice")
    digest = None
    if bundle_id is not None:
        digest = parse_digest(bundle_id, "bundle_id")
        if digest is None:
            raise UsageError(f"bundle_id: an array takes {DIGEST_PREFIX} bundle ids")
    members = array_members(spec, sorted(indices), limit, new_array_id())
    if not embedded:
        return service.submissions.submit_many(
            [(data, working_dir, digest) for data in members], once=once
        )
    jobs = [
        service.submissions.submit(
            data,
            working_dir=working_dir,
            source_dir=Path(source_dir) if source_dir else None,
            client_env=client_env,
            bundle_digest=digest,
        )
        for data in members
    ]
    if once is not None:
        service.store.keep_answer(once, [job.id for job in jobs])
    return jobs
