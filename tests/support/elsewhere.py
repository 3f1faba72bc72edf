"""What another control plane sharing the store does, done straight in the store: the control
plane under test is told nothing of it."""

from __future__ import annotations

from typing import Any

from gpulayer.control.store import JobRecord, Store
from gpulayer.spec import JobSpec


def queue_elsewhere(store: Store, job_id: str, spec: dict[str, Any]) -> JobRecord:
    """A queued job, stored as another control plane's submit stores it."""
    validated = JobSpec.model_validate(spec)
    return store.insert_job(
        job_id=job_id,
        name=job_id,
        spec=validated.model_dump(mode="json"),
        state="queued",
        target=validated.placement.target,
        working_dir=None,
        has_bundle=False,
        labels={},
    )
