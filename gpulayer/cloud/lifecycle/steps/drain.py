"""The drain step: take the worker off (stop it over its link, close the tunnel, retire it,
revoke its token), then terminate. A machine its provider reclaimed is not asked to stop a
worker it no longer runs, unless the provider's machines outlive a reclaim."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gpulayer.cloud.lifecycle import step_result
from gpulayer.cloud.lifecycle.steps.terminate import terminate
from gpulayer.cloud.protocol import OutlivesReclaim

if TYPE_CHECKING:
    from gpulayer.cloud.lifecycle.step_result import StepResult
    from gpulayer.cloud.lifecycle.steps.context import StepContext


def drain(ctx: StepContext, request_id: str) -> StepResult:
    r = ctx.fresh(request_id)
    if r.state != "draining":
        return step_result.skipped("drain", time.time(), f"the instance is {r.state}")
    reclaimed = r.outcome == "reclaimed"
    ctx.abandon_worker(
        request_id, stop=not reclaimed or isinstance(ctx.provider(r), OutlivesReclaim)
    )
    worker_id = ctx.worker_of(request_id)
    if worker_id:
        ctx.service.retire_worker(worker_id)
    ctx.store.release_reservation(request_id)
    if r.token_hash:
        ctx.store.remove_token(r.token_hash)
    if not ctx.move(r, "terminating", "worker stopped"):
        return step_result.skipped("drain", time.time(), f"the instance is {r.state}")
    ctx.keep(request_id, step_result.done("drain", time.time(), "worker stopped"))
    return terminate(ctx, request_id)
