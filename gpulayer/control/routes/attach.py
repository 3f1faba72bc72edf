"""A running job's rented machine: its ports forwarded to the control plane's loopback for
`gpulayer attach` to carry on to the submitting shell, and commands run in the job's folder and
environment for `gpulayer exec`, each recorded in the job's log."""

from __future__ import annotations

import shlex
from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from gpulayer.cloud.lifecycle.records import InstanceRecord
from gpulayer.control.json_route import OffLoopJSONRoute
from gpulayer.control.routes.deps import ADMIN, ApiContext, Context
from gpulayer.control.store import JobRecord
from gpulayer.errors import UsageError
from gpulayer.spec.models import MAX_NODES

router = APIRouter(route_class=OffLoopJSONRoute)


class PortBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    port: Annotated[int, Field(ge=1, le=65535)]
    node: Annotated[int, Field(ge=0, le=MAX_NODES - 1)] = 0


class ExecBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    argv: Annotated[
        list[Annotated[str, Field(max_length=4096)]], Field(min_length=1, max_length=256)
    ]
    node: Annotated[int, Field(ge=0, le=MAX_NODES - 1)] = 0
    timeout: Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)] = 300.0


def _machine(
    context: ApiContext, job_ref: str, node: int, what: str
) -> tuple[JobRecord, InstanceRecord, set[str]]:
    """The running job, its node's live machine and every live machine's request id."""
    if not context.embedded:
        raise UsageError(f"{what}: only the local control plane reaches a job's machine")
    service = context.service
    job = service.jobs.get_job(job_ref)
    if job.state != "running":
        raise UsageError(f"{what}: job {job.id} is {job.state}, not running")
    live = service.store.list_instances(live_only=True)
    mine = [r for r in live if r.job_id == job.id and r.node_rank == node]
    if not mine:
        hint = "; a local job runs on this machine" if job.target == "local" else ""
        raise UsageError(
            f"{what}: job {job.id} runs on no rented machine of this control plane "
            f"(node {node}){hint}"
        )
    return job, mine[0], {r.request_id for r in live}


@router.post("/v1/jobs/{job_ref}/exec", dependencies=ADMIN)
def exec_in_job(job_ref: str, body: ExecBody, context: Context) -> dict[str, Any]:
    job, record, _ = _machine(context, job_ref, body.node, "exec")
    if not body.argv[0]:
        raise UsageError("argv: the program (first argument) may not be empty")
    code, out, err = context.service.cloud.run_in_job(record, job.id, body.argv, body.timeout)
    # Recorded in the job's own log: who reached into it, and what came of it.
    context.service.changes.log_system(
        job.id,
        job.attempts,
        [f"exec on node {body.node}: {shlex.join(body.argv)} (exit {code})"],
    )
    return {"job_id": job.id, "node": body.node, "exit_code": code, "stdout": out, "stderr": err}


@router.post("/v1/jobs/{job_ref}/ports", dependencies=ADMIN)
def forward_port(job_ref: str, body: PortBody, context: Context) -> dict[str, Any]:
    job, record, live = _machine(context, job_ref, body.node, "attach")
    local = context.service.cloud.forward_port(record, body.port, live)
    return {
        "job_id": job.id,
        "node": body.node,
        "port": body.port,
        "address": f"127.0.0.1:{local}",
    }
