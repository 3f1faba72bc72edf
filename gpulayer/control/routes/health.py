"""Whether the control plane answers, and (for operators) how busy its long polls are."""

from __future__ import annotations

import os
from typing import Any

from fastapi import APIRouter, Depends

from gpulayer import __version__
from gpulayer.control.json_route import OffLoopJSONRoute
from gpulayer.control.routes.deps import Context, admin_only

router = APIRouter(route_class=OffLoopJSONRoute)


@router.get("/v1/health")
def health(context: Context) -> dict[str, Any]:
    return {
        "ok": True,
        "version": __version__,
        "embedded": context.embedded,
        "pid": os.getpid(),
    }


@router.get("/v1/server", dependencies=[Depends(admin_only)])
def server_state(context: Context) -> dict[str, Any]:
    """For operators: how many workers' claim long-polls wait for work right now."""
    return {"version": __version__, "claim_polls_waiting": context.service.changes.news.listening()}
