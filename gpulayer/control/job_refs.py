"""A job named by its id or a unique prefix of it (3 characters or more)."""

from __future__ import annotations

from gpulayer.control.store import Store
from gpulayer.errors import NotFoundError, UsageError


def resolve_job_id(store: Store, job_ref: str) -> str:
    try:
        return store.get_job(job_ref).id
    except NotFoundError:
        matches = store.find_job_ids(job_ref) if len(job_ref) >= 3 else []
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise UsageError(
                f"JOB: {job_ref!r} matches several jobs: {', '.join(matches)}"
            ) from None
        raise
