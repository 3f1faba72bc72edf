"""The control plane's schedule routes. Thin: parse, call the schedule service, shape."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Response
from pydantic import BaseModel, ConfigDict

from gpulayer.control.bundle_store import parse_digest
from gpulayer.control.client_paths import refuse_client_paths
from gpulayer.control.json_route import OffLoopJSONRoute
from gpulayer.control.reserved_labels import reserved_label_lines
from gpulayer.control.routes.deps import ADMIN, ApiContext, Context, once_key
from gpulayer.control.schedule_service import ScheduleService, TickSkipped
from gpulayer.control.schedule_views import run_view, schedule_detail, schedule_summary
from gpulayer.control.store.once_keys import KeyTaken, OnceKey
from gpulayer.control.uploads import incoming_bundle
from gpulayer.errors import SpecError, UsageError


class ApplyBody(BaseModel):
    """What `POST /v1/schedules` takes; a field of the wrong type is a 422 naming it."""

    model_config = ConfigDict(extra="ignore")

    schedule: dict[str, Any]
    working_dir: str | None = None
    source_dir: str | None = None
    bundle_id: str | None = None


router = APIRouter(route_class=OffLoopJSONRoute)


def _schedules(context: ApiContext) -> ScheduleService:
    if context.schedules is None:
        raise UsageError("schedules: this control plane does not run schedules")
    return context.schedules


@router.post("/v1/schedules", dependencies=ADMIN)
def apply(
    body: ApplyBody, response: Response, context: Context, once: OnceKey | None = Depends(once_key)
) -> dict[str, Any]:
    service = context.service
    # Applying is an upsert by name, so the same document applied twice leaves the same
    # schedule: the key is kept once it is applied, and a resend is answered as the
    # first send was (whether the schedule was new) rather than as a replace.
    kept = context.answers.kept(once)
    if kept is not None:
        response.headers["Idempotent-Replayed"] = "true"
        schedules = _schedules(context)
        loaded = schedules.load_id(kept.ids[0])
        created = bool(kept.extra.get("created"))
        return {"created": created, "schedule": schedule_detail(schedules, loaded)}
    refuse_client_paths(
        embedded=context.embedded,
        working_dir=body.working_dir,
        source_dir=body.source_dir,
        has_bundle=body.bundle_id is not None,
    )
    job = body.schedule.get("job")
    reserved = reserved_label_lines(job, "job.")
    if reserved:
        raise SpecError(reserved)
    # A sha256: id names a bundle the server keeps for other jobs too; any other id a
    # one-shot upload the schedule takes over.
    digest = parse_digest(body.bundle_id) if body.bundle_id else None
    bundle = None if digest is not None else incoming_bundle(service, body.bundle_id)
    schedules = _schedules(context)
    record, created = schedules.apply(
        body.schedule,
        working_dir=body.working_dir,
        source_dir=Path(body.source_dir) if body.source_dir else None,
        bundle=bundle,
        bundle_digest=digest,
    )
    if once is not None:
        with contextlib.suppress(KeyTaken):  # a concurrent duplicate applied it too
            service.store.keep_answer(once, [record.id], {"created": created})
    loaded = schedules.load(record.name)
    return {"created": created, "schedule": schedule_detail(schedules, loaded)}


@router.get("/v1/schedules", dependencies=ADMIN)
def list_schedules(context: Context) -> list[dict[str, Any]]:
    found = _schedules(context)
    return [schedule_summary(found, loaded) for loaded in found.all()]


@router.get("/v1/schedules/{name}", dependencies=ADMIN)
def show(name: str, context: Context) -> dict[str, Any]:
    found = _schedules(context)
    return schedule_detail(found, found.load(name))


@router.get("/v1/schedules/{name}/runs", dependencies=ADMIN)
def runs(name: str, context: Context, limit: int = 50) -> list[dict[str, Any]]:
    found = _schedules(context)
    loaded = found.load(name)
    now = time.time()
    return [
        run_view(found, run, loaded.schedule.timezone, now)
        for run in found.store.schedule_runs(loaded.record.id, limit=max(1, min(limit, 1000)))
    ]


@router.post("/v1/schedules/{name}/pause", dependencies=ADMIN)
def pause(name: str, context: Context) -> dict[str, Any]:
    found = _schedules(context)
    record = found.pause(name)
    return schedule_summary(found, found.load(record.name))


@router.post("/v1/schedules/{name}/resume", dependencies=ADMIN)
def resume(name: str, context: Context) -> dict[str, Any]:
    found = _schedules(context)
    record = found.resume(name)
    return schedule_summary(found, found.load(record.name))


@router.post("/v1/schedules/{name}/trigger", dependencies=ADMIN)
def trigger(
    name: str, response: Response, context: Context, once: OnceKey | None = Depends(once_key)
) -> dict[str, Any]:
    # A trigger sent again with its key is answered with the run it started; one that
    # was skipped made nothing, so nothing is kept of it.
    answers = context.answers
    made = answers.prior(once)
    if made is None:
        try:
            job_id = _schedules(context).trigger(name, once=once)
        except TickSkipped as skipped:
            return {"job_id": None, "skipped": skipped.reason, "message": str(skipped)}
        except KeyTaken:
            made = answers.prior(once)
            if made is None:
                raise
        else:
            return {"job_id": job_id, "skipped": None, "message": None}
    response.headers["Idempotent-Replayed"] = "true"
    return {"job_id": made[0], "skipped": None, "message": None}


@router.delete("/v1/schedules/{name}", dependencies=ADMIN)
def delete(name: str, context: Context) -> dict[str, Any]:
    record = _schedules(context).delete(name)
    return {"name": record.name, "id": record.id, "deleted": True}
