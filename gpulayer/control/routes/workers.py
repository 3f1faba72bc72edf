"""Workers: the list an admin reads, and a worker's join, heartbeat and claim."""

from __future__ import annotations

from collections import Counter
from typing import Any

from fastapi import APIRouter

from gpulayer.control.claim_poll import claim_long_poll
from gpulayer.control.json_route import OffLoopJSONRoute
from gpulayer.control.routes.deps import (
    ADMIN,
    CHECKED,
    MAX_WAIT_SECONDS,
    Caller,
    Context,
    WaitSeconds,
)
from gpulayer.control.views import worker_view
from gpulayer.protocol.messages import Heartbeat, Registration

router = APIRouter(route_class=OffLoopJSONRoute)


@router.get("/v1/workers", dependencies=ADMIN)
def workers(context: Context, all: bool = False) -> list[dict[str, Any]]:
    service = context.service
    running = Counter(a.worker_id for a in service.store.active_attempts())
    return [
        worker_view(w, running=running[w.id])
        for w in service.workers.list_workers()
        if all or w.state != "gone"
    ]


@router.post("/v1/workers", dependencies=[CHECKED])
def register(registration: Registration, context: Context, who: Caller) -> dict[str, Any]:
    worker, credential = context.service.workers.register_worker(registration, who)
    return {"worker_id": worker.id, "epoch": worker.epoch, "token": credential}


@router.post("/v1/workers/{worker_id}/heartbeat", dependencies=[CHECKED])
def heartbeat(
    worker_id: str, context: Context, who: Caller, body: Heartbeat | None = None
) -> dict[str, Any]:
    running = body.running if body is not None else []
    degraded = body.degraded if body is not None else None
    return context.service.workers.heartbeat(
        worker_id, running=running, caller=who, degraded=degraded
    ).model_dump()


@router.post("/v1/workers/{worker_id}/leave", dependencies=[CHECKED])
def leave(worker_id: str, context: Context, who: Caller) -> dict[str, Any]:
    """The worker is stopping (SIGTERM): it is placed nothing more from now."""
    worker = context.service.workers.leave(worker_id, who)
    return {"worker_id": worker.id, "state": worker.state}


@router.post("/v1/workers/{worker_id}/claim", dependencies=[CHECKED])
async def claim(
    worker_id: str,
    context: Context,
    who: Caller,
    wait: WaitSeconds = 0,
    signals: bool = False,
) -> list[dict[str, Any]] | dict[str, Any]:
    reply = await claim_long_poll(
        context.service.claims, worker_id, min(wait, MAX_WAIT_SECONDS), who, with_cancels=signals
    )
    # Without signals=1 the reply is the bare list of assignments older workers read.
    if not signals:
        return [a.model_dump() for a in reply.assignments]
    return reply.model_dump()
