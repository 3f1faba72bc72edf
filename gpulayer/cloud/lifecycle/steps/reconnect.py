"""The reconnect step: reopen the SSH tunnel of an instance whose worker this controller lost
touch with (after a restart, or a dropped connection), on the same port, so the worker that
kept retrying reaches the control plane again. A failed try comes back with a not_before."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gpulayer.cloud.lifecycle import step_result
from gpulayer.cloud.lifecycle.links import reopen
from gpulayer.cloud.lifecycle.results import error_of
from gpulayer.cloud.lifecycle.states import HOLDS_WORKER
from gpulayer.cloud.lifecycle.steps.check import look

if TYPE_CHECKING:
    from gpulayer.cloud.lifecycle.step_result import StepResult
    from gpulayer.cloud.lifecycle.steps.context import StepContext

log = logging.getLogger("gpulayer.lifecycle")

RETRY_SECONDS = 5.0


def reconnect(ctx: StepContext, request_id: str) -> StepResult:
    r = ctx.fresh(request_id)
    worker_id = ctx.worker_of(request_id)
    if r.state not in HOLDS_WORKER or not r.machine or not r.key_path or not r.tunnel_port:
        return step_result.skipped("reconnect", time.time(), f"the instance is {r.state}")
    looked = look(ctx, r, "reconnect")
    if looked.move_to is not None:
        return looked  # the machine is gone: nothing to reconnect to
    try:
        link = reopen(
            r.machine,
            Path(r.key_path),
            ctx.keys_dir,
            request_id,
            control_port=ctx.control_port,
            tunnel_port=r.tunnel_port,
            install_dir=r.install_dir or "",
            timeout=30,
        )
    except Exception as exc:
        log.warning("instance %s: reopening its tunnel failed: %s", request_id, exc)
        now = time.time()
        return step_result.failed("reconnect", now, error_of(exc), not_before=now + RETRY_SECONDS)
    ctx.links.put(request_id, link)
    if worker_id:
        # The worker was silent because we were gone: count from now.
        ctx.service.credit_worker_silence(worker_id)
    ctx.store.update_instance(request_id, relink_since=None)
    ctx.note(r.job_id, f"instance {request_id}: SSH tunnel reopened on port {r.tunnel_port}")
    return step_result.done("reconnect", time.time(), f"tunnel reopened on {r.tunnel_port}")
