"""The control plane's schedule routes. Thin: parse, call the schedule service, shape."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Response
from pydantic import BaseModel, ConfigDict

from gpulayer.control.bundle_store import parse_digest
from gpulayer.control.client_paths import refuse_client_paths
from gpulayer.control.idempotency import Answers
from gpulayer.control.reserved_labels import reserved_label_lines
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


def add_schedule_routes(
    app: FastAPI,
    service: Any,
    auth: list[Any],
    *,
    embedded: bool,
    answers: Answers | None = None,
    once_key: Callable[..., Any] | None = None,
) -> None:
    """``answers`` and ``once_key``: the Idempotency-Key of a trigger (see idempotency.py)."""
    keyed = once_key or _no_key

    def schedules() -> ScheduleService:
        found = service.schedules
        if found is None:
            raise UsageError("schedules: this control plane does not run schedules")
        assert isinstance(found, ScheduleService)
        return found

    @app.post("/v1/schedules", dependencies=auth)
    def apply(
        body: ApplyBody, response: Response, once: OnceKey | None = Depends(keyed)
    ) -> dict[str, Any]:
        # Applying is an upsert by name, so the same document applied twice leaves the same
        # schedule: the key is kept once it is applied, and a resend is answered as the
        # first send was (whether the schedule was new) rather than as a replace.
        kept = answers.kept(once) if answers is not None else None
        if kept is not None:
            response.headers["Idempotent-Replayed"] = "true"
            loaded = schedules().load_id(kept.ids[0])
            created = bool(kept.extra.get("created"))
            return {"created": created, "schedule": schedule_detail(schedules(), loaded)}
        refuse_client_paths(
            embedded=embedded,
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
        record, created = schedules().apply(
            body.schedule,
            working_dir=body.working_dir,
            source_dir=Path(body.source_dir) if body.source_dir else None,
            bundle=bundle,
            bundle_digest=digest,
        )
        if once is not None:
            with contextlib.suppress(KeyTaken):  # a concurrent duplicate applied it too
                service.store.keep_answer(once, [record.id], {"created": created})
        loaded = schedules().load(record.name)
        return {"created": created, "schedule": schedule_detail(schedules(), loaded)}

    @app.get("/v1/schedules", dependencies=auth)
    def list_schedules() -> list[dict[str, Any]]:
        found = schedules()
        return [schedule_summary(found, loaded) for loaded in found.all()]

    @app.get("/v1/schedules/{name}", dependencies=auth)
    def show(name: str) -> dict[str, Any]:
        return schedule_detail(schedules(), schedules().load(name))

    @app.get("/v1/schedules/{name}/runs", dependencies=auth)
    def runs(name: str, limit: int = 50) -> list[dict[str, Any]]:
        import time

        found = schedules()
        loaded = found.load(name)
        now = time.time()
        return [
            run_view(found, run, loaded.schedule.timezone, now)
            for run in found.store.schedule_runs(loaded.record.id, limit=max(1, min(limit, 1000)))
        ]

    @app.post("/v1/schedules/{name}/pause", dependencies=auth)
    def pause(name: str) -> dict[str, Any]:
        record = schedules().pause(name)
        return schedule_summary(schedules(), schedules().load(record.name))

    @app.post("/v1/schedules/{name}/resume", dependencies=auth)
    def resume(name: str) -> dict[str, Any]:
        record = schedules().resume(name)
        return schedule_summary(schedules(), schedules().load(record.name))

    @app.post("/v1/schedules/{name}/trigger", dependencies=auth)
    def trigger(
        name: str, response: Response, once: OnceKey | None = Depends(keyed)
    ) -> dict[str, Any]:
        # A trigger sent again with its key is answered with the run it started; one that
        # was skipped made nothing, so nothing is kept of it.
        made = answers.prior(once) if answers is not None else None
        if made is None:
            try:
                job_id = schedules().trigger(name, once=once)
            except TickSkipped as skipped:
                return {"job_id": None, "skipped": skipped.reason, "message": str(skipped)}
            except KeyTaken:
                assert answers is not None
                made = answers.prior(once)
                if made is None:
                    raise
            else:
                return {"job_id": job_id, "skipped": None, "message": None}
        response.headers["Idempotent-Replayed"] = "true"
        return {"job_id": made[0], "skipped": None, "message": None}

    @app.delete("/v1/schedules/{name}", dependencies=auth)
    def delete(name: str) -> dict[str, Any]:
        record = schedules().delete(name)
        return {"name": record.name, "id": record.id, "deleted": True}


def _no_key() -> None:
    return None
