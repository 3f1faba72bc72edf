"""A running job's ports on its rented machine, forwarded to the control plane's loopback for
`gpulayer attach` to carry on to the submitting shell."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from gpulayer.control.json_route import OffLoopJSONRoute
from gpulayer.control.routes.deps import ADMIN, Context
from gpulayer.errors import UsageError
from gpulayer.spec.models import MAX_NODES

router = APIRouter(route_class=OffLoopJSONRoute)


class PortBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    port: Annotated[int, Field(ge=1, le=65535)]
    node: Annotated[int, Field(ge=0, le=MAX_NODES - 1)] = 0


@router.post("/v1/jobs/{job_ref}/ports", dependencies=ADMIN)
def forward_port(job_ref: str, body: PortBody, context: Context) -> dict[str, Any]:
    if not context.embedded:
        raise UsageError("attach: only the local control plane forwards a job's ports")
    service = context.service
    job = service.jobs.get_job(job_ref)
    if job.state != "running":
        raise UsageError(f"attach: job {job.id} is {job.state}, not running")
    live = service.store.list_instances(live_only=True)
    mine = [r for r in live if r.job_id == job.id and r.node_rank == body.node]
    if not mine:
        hint = "; a local job's ports are this machine's own" if job.target == "local" else ""
        raise UsageError(
            f"attach: job {job.id} runs on no rented machine of this control plane "
            f"(node {body.node}){hint}"
        )
    local = service.cloud.forward_port(mine[0], body.port, {r.request_id for r in live})
    return {
        "job_id": job.id,
        "node": body.node,
        "port": body.port,
        "address": f"127.0.0.1:{local}",
    }
