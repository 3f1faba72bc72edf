"""Jobs once submitted: list, read, cancel, delete and prune them, their logs and artifacts."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict, Field

from gpulayer.control.json_route import OffLoopJSONRoute
from gpulayer.control.routes.deps import (
    ADMIN,
    CHECKED,
    MAX_WAIT_SECONDS,
    ArrayId,
    Caller,
    Context,
    Cursor,
    Limit,
    NodeRank,
    WaitSeconds,
)
from gpulayer.control.routes.details import job_detail
from gpulayer.control.views import job_view, log_view
from gpulayer.errors import NotFoundError

router = APIRouter(route_class=OffLoopJSONRoute)

_AGE_MAX = 100 * 365.25 * 86400  # older than a century: older than any row


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class DeleteBody(_Body):
    jobs: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(min_length=1)
    dry_run: bool = False


class ViewsBody(_Body):
    jobs: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        min_length=1, max_length=10_000
    )


class PruneBody(_Body):
    older_than_seconds: Annotated[float, Field(ge=0, le=_AGE_MAX, allow_inf_nan=False)]
    dry_run: bool = False


@router.get("/v1/jobs", dependencies=ADMIN)
def list_jobs(
    context: Context,
    limit: Limit = 50,
    state: str | None = None,
    label: Annotated[list[str] | None, Query()] = None,
    schedule: str | None = None,
) -> list[dict[str, Any]]:
    """Newest first; `state` (comma-separated), `label=K=V` (repeatable, all must hold)
    and `schedule` (its runs) narrow the list, as the dashboard's jobs page does."""
    from gpulayer.control.job_filters import check_states, parse_label_pairs, with_schedule

    states = check_states(state.split(","), "state") if state else None
    labels = with_schedule(parse_label_pairs(label or [], "label"), schedule, "schedule")
    jobs = context.service.jobs.list_jobs(states=states, labels=labels, limit=limit)
    return [job_view(j) for j in jobs]


@router.post("/v1/jobs/views", dependencies=ADMIN)
def job_views(body: ViewsBody, context: Context) -> list[dict[str, Any]]:
    """These jobs' views (by id), in the order asked: how a map waits for its items with one
    request rather than one each."""
    found = {job.id: job for job in context.service.store.get_jobs(body.jobs)}
    missing = next((ref for ref in body.jobs if ref not in found), None)
    if missing is not None:
        raise NotFoundError(f"jobs: no job {missing!r}")
    return [job_view(found[ref]) for ref in body.jobs]


@router.post("/v1/jobs/delete", dependencies=ADMIN)
def delete_jobs(body: DeleteBody, context: Context) -> list[dict[str, Any]]:
    return [job_view(j) for j in context.service.jobs.delete_jobs(body.jobs, dry_run=body.dry_run)]


@router.post("/v1/jobs/prune", dependencies=ADMIN)
def prune_jobs(body: PruneBody, context: Context) -> list[dict[str, Any]]:
    pruned = context.service.jobs.prune(
        older_than_seconds=body.older_than_seconds, dry_run=body.dry_run
    )
    return [job_view(j) for j in pruned]


@router.get("/v1/arrays/{array_id}", dependencies=ADMIN)
def array(array_id: ArrayId, context: Context) -> list[dict[str, Any]]:
    """A job array's jobs (submit --array), by index."""
    return [job_view(job) for job in context.service.jobs.array_jobs(array_id)]


@router.post("/v1/arrays/{array_id}/cancel", dependencies=ADMIN)
def cancel_array(array_id: ArrayId, context: Context) -> list[dict[str, Any]]:
    return [job_view(job) for job in context.service.jobs.cancel_array(array_id)]


@router.get("/v1/jobs/{job_ref}", dependencies=ADMIN)
def get_job(job_ref: str, context: Context) -> dict[str, Any]:
    return job_detail(context.service, context.service.jobs.resolve_job_id(job_ref))


@router.post("/v1/jobs/{job_ref}/cancel", dependencies=ADMIN)
def cancel(job_ref: str, context: Context) -> dict[str, Any]:
    job = context.service.jobs.cancel(job_ref)
    return job_detail(context.service, job.id)


@router.get("/v1/jobs/{job_ref}/logs", dependencies=ADMIN)
def logs(
    job_ref: str,
    context: Context,
    after: Cursor = 0,
    wait: WaitSeconds = 0,
    node: NodeRank = None,
) -> dict[str, Any]:
    lines, job = context.service.jobs.read_logs(
        job_ref, after=after, wait=min(wait, MAX_WAIT_SECONDS), node=node
    )
    return {
        "lines": [log_view(line) for line in lines],
        "job": job_view(job),
    }


@router.get("/v1/jobs/{job_ref}/artifacts", dependencies=[CHECKED])
def artifacts(job_ref: str, context: Context, who: Caller) -> list[dict[str, Any]]:
    service = context.service
    service.access.check_artifact_access(service.jobs.resolve_job_id(job_ref), who)
    return service.jobs.artifacts(job_ref)


@router.get("/v1/jobs/{job_ref}/artifacts/{path:path}", dependencies=[CHECKED])
def artifact(job_ref: str, path: str, context: Context, who: Caller) -> FileResponse:
    service = context.service
    service.access.check_artifact_access(service.jobs.resolve_job_id(job_ref), who)
    return FileResponse(service.jobs.artifact_path(job_ref, path))
