"""What a worker sends and fetches about the attempts it runs: logs, outcomes, files."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse

from gpulayer.control.body_pipe import read_body_on_a_thread
from gpulayer.control.json_route import OffLoopJSONRoute
from gpulayer.control.output_uploads import receive_within
from gpulayer.control.routes.deps import ARCHIVE_BODY, CHECKED, Caller, Context, RowId
from gpulayer.control.text_checks import unsafe_text
from gpulayer.errors import SpecError
from gpulayer.protocol.messages import (
    AttemptReport,
    FinishBatch,
    FinishOutcome,
    FinishReply,
    LogBatch,
)

router = APIRouter(route_class=OffLoopJSONRoute)


# Not CHECKED: a job's output is repaired rather than refused (service.reports.append_logs).
@router.post("/v1/attempts/{attempt_id}/logs")
def attempt_logs(
    attempt_id: RowId, batch: LogBatch, context: Context, who: Caller
) -> dict[str, Any]:
    context.service.reports.append_logs(attempt_id, batch.lines, who)
    return {"ok": True}


# Checked here but for its logs, which are repaired like any of the job's output.
@router.post("/v1/attempts/{attempt_id}/finish")
def finish(
    attempt_id: RowId, report: AttemptReport, context: Context, who: Caller
) -> dict[str, Any]:
    problems = unsafe_text(report.model_dump(mode="json", exclude={"logs"}))
    if problems:
        raise SpecError(problems)
    context.service.reports.finish_attempt(attempt_id, report, who)
    return {"ok": True}


# Logs are repaired like any of the job's output; the rest of each report is checked, and
# a report that fails the check is refused alone, not with the batch it came in.
@router.post("/v1/workers/{worker_id}/finish")
def finish_many(
    worker_id: str, batch: FinishBatch, context: Context, who: Caller
) -> dict[str, Any]:
    refused: dict[int, FinishOutcome] = {}
    storable: list[tuple[int, AttemptReport]] = []
    for index, item in enumerate(batch.reports):
        problems = unsafe_text(item.report.model_dump(mode="json", exclude={"logs"}))
        if problems:
            refused[index] = FinishOutcome(
                attempt_id=item.attempt_id, outcome="refused", detail="; ".join(problems)
            )
        else:
            storable.append((item.attempt_id, item.report))
    recorded = iter(context.service.reports.finish_attempts(worker_id, storable, who))
    results = [refused.get(i) or next(recorded) for i in range(len(batch.reports))]
    return FinishReply(results=results).model_dump()


@router.get("/v1/jobs/{job_id}/bundle", dependencies=[CHECKED])
def bundle(job_id: str, context: Context, who: Caller) -> FileResponse:
    service = context.service
    resolved = service.jobs.resolve_job_id(job_id)
    service.access.check_job_access(resolved, who)
    return FileResponse(service.jobs.bundle_path(resolved))


@router.put("/v1/attempts/{attempt_id}/outputs", openapi_extra=ARCHIVE_BODY)
async def upload_outputs(
    attempt_id: RowId, request: Request, context: Context, who: Caller
) -> dict[str, Any]:
    service = context.service
    await asyncio.to_thread(service.access.own_attempt, attempt_id, who)
    limits = service.output_limits
    # Unpacked while it streams in: a refusal is answered before the rest is read.
    await read_body_on_a_thread(
        request.stream(),
        lambda upload: service.outputs.receive_outputs(attempt_id, upload, who),
        on_received=lambda received: receive_within(received, limits),
    )
    return {"ok": True}
