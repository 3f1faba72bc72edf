"""A job's log lines as server-sent events for the dashboard's job page."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.responses import StreamingResponse

from gpulayer.control.json_route import OffLoopJSONRoute
from gpulayer.control.service import ControlService
from gpulayer.control.ui.sessions import SESSION_COOKIE, SessionKeeper
from gpulayer.control.ui.web import error_status, json_answer, secured, session_of, ui_of
from gpulayer.control.views import log_view
from gpulayer.errors import GpulayerError

router = APIRouter(route_class=OffLoopJSONRoute, include_in_schema=False)

_LOG_RECHECK_SECONDS = 2.0
_SESSION_RECHECK_SECONDS = 30.0


@router.get("/ui/api/jobs/{job_ref}/logs")
async def ui_log_stream(job_ref: str, request: Request, after: int = 0) -> Response:
    """Server-sent events: each log line once, in order; `end` when the job has ended."""
    session = await asyncio.to_thread(session_of, request)
    if session is None:
        return json_answer({"error": "not logged in"}, 401)
    ui = ui_of(request)
    try:
        job_id = await asyncio.to_thread(ui.service.jobs.resolve_job_id, job_ref)
    except GpulayerError as exc:
        return json_answer({"error": str(exc)}, error_status(exc))
    resume = request.headers.get("last-event-id", "")
    start = int(resume) if resume.isdigit() else max(0, after)
    cookie = request.cookies.get(SESSION_COOKIE)
    return secured(
        StreamingResponse(
            _log_events(ui.service, ui.keeper, cookie, job_id, start),
            media_type="text/event-stream",
            headers={"X-Accel-Buffering": "no"},
        )
    )


async def _log_events(
    service: ControlService, keeper: SessionKeeper, cookie: str | None, job_id: str, after: int
) -> Any:
    # Read the store only when the service says something changed (or every couple of
    # seconds, for writers in another server process), so idle streams cost next to nothing.
    loop = asyncio.get_running_loop()
    seen = -1
    last_read = 0.0
    session_checked = loop.time()
    yield "retry: 2000\n\n"
    while True:
        now = loop.time()
        if now - session_checked > _SESSION_RECHECK_SECONDS:
            session_checked = now
            if await asyncio.to_thread(keeper.find, cookie) is None:
                yield "event: logout\ndata: {}\n\n"
                return
        if service.changes.version != seen or now - last_read >= _LOG_RECHECK_SECONDS:
            seen = service.changes.version
            last_read = now
            lines, job = await asyncio.to_thread(service.jobs.read_logs, job_id, after=after)
            for line in lines:
                after = line.id
                yield f"id: {line.id}\ndata: {json.dumps(log_view(line))}\n\n"
            if lines:
                continue
            if job.terminal:
                yield f"event: end\ndata: {json.dumps({'state': job.state})}\n\n"
                return
        await asyncio.sleep(0.2)
