"""The fuller views some routes answer with: a job with its attempts, cost and instances."""

from __future__ import annotations

import time
from typing import Any

from gpulayer.control.service import ControlService
from gpulayer.control.views import cost_view, job_view, lifecycle_view
from gpulayer.protocol.messages import SETUP_LOG_PREFIX


def instances_detail(
    service: ControlService, *, job_id: str | None, live_only: bool
) -> list[dict[str, Any]]:
    now = time.time()
    records = service.store.list_instances(job_id=job_id, live_only=live_only)
    # A fleet's idle limits depend on its other machines: read over every live one.
    limits = service.cloud.idle_limits(service.store.list_instances(live_only=True))
    return [
        lifecycle_view(
            r,
            service.store.instance_history(r.request_id),
            now,
            limits.get(r.request_id, service.cloud.idle_seconds(r.provider)),
        )
        for r in records
    ]


def job_detail(service: ControlService, job_id: str) -> dict[str, Any]:
    job = service.store.get_job(job_id)
    attempts = service.jobs.attempts(job_id)
    workers = {w.id: w for w in service.workers.list_workers()}
    view = job_view(job, attempts, workers)
    view["ports"] = list(job.spec.get("ports") or [])
    spans = service.store.setup_spans(job_id, SETUP_LOG_PREFIX)
    for attempt in view["attempts"]:
        if attempt["number"] in spans:
            start, end = spans[attempt["number"]]
            attempt["setup_seconds"] = round(end - start, 3)
    instances = service.store.list_instances(job_id=job_id)
    if instances:
        view["cost"] = cost_view(instances)
        view["instances"] = instances_detail(service, job_id=job_id, live_only=False)
    if job.state == "queued":
        view["waiting_for"] = service.jobs.waiting_reasons(job)
    return view
