"""The terminate step: one provider call ends the instance (a gang's nodes in one call, made by
the last node to get here), confirmed by a describe; a failure is retried after a backoff kept
in the store (next_step_at, step_failures), so a restart keeps it."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from gpulayer.backoff import CLOUD_TERMINATE_RETRY
from gpulayer.cloud.lifecycle import gangs, step_result
from gpulayer.cloud.lifecycle.results import error_of
from gpulayer.cloud.lifecycle.step_result import StepError
from gpulayer.cloud.protocol import FinishingProvider

if TYPE_CHECKING:
    from gpulayer.cloud.lifecycle.records import InstanceRecord
    from gpulayer.cloud.lifecycle.step_result import StepResult
    from gpulayer.cloud.lifecycle.steps.context import StepContext
    from gpulayer.cloud.protocol import Provider

log = logging.getLogger("gpulayer.lifecycle")

REQUEST_TAG = "gpulayer:request"


def terminate(ctx: StepContext, request_id: str) -> StepResult:
    r = ctx.fresh(request_id)
    if r.state != "terminating":
        return step_result.skipped("terminate", time.time(), f"the instance is {r.state}")
    gang = ctx.gang(r)
    if not gangs.terminate_leader(r, gang):
        # The gang's nodes end in one call, made once all of them are here.
        return step_result.skipped("terminate", time.time(), "its gang ends in one call")
    nodes = gangs.terminating(gang) if r.launch_id else [r]
    provider = ctx.provider(r)
    if provider is None:
        why = f"provider {r.provider} is not enabled"
        return _later(ctx, r, StepError("ProviderNotEnabled", why))
    try:
        ids = _end_machines(provider, r, nodes, finished=_ended_by_itself(ctx, r))
    except Exception as exc:
        return _later(ctx, r, error_of(exc))
    ended_at = time.time()  # one confirmation ends every node at once
    for node in nodes:
        # A machine never usable (its key refused) was charged only until the refusal.
        ctx.move(node, "terminated", "the provider confirmed", ended_at=node.ended_at or ended_at)
    for node in nodes:
        ctx.gone(node)
    if ids:
        # Jobs waiting for capacity look again now (their choice reads when capacity was
        # last freed from the instances' end times).
        ctx.store.end_capacity_waits()
    if r.launch_id:
        ctx.note(
            r.job_id,
            f"gang of {len(nodes)} torn down together: " + ", ".join(n.request_id for n in nodes),
        )
    else:
        ctx.note(r.job_id, f"instance {request_id} torn down")
    return step_result.done(
        "terminate", ended_at, f"ended {', '.join(ids) or 'nothing'}", move_to="terminated"
    )


def _ended_by_itself(ctx: StepContext, r: InstanceRecord) -> bool:
    """The instance ends because its job ended by itself (it succeeded, or its workload
    failed), not by a cancel, a timeout, a lost machine or a launch that went wrong."""
    if not r.job_id:
        return False  # a fleet's machine no job took: it ends because its fleet let it go
    job = ctx.store.get_job(r.job_id)
    if r.outcome is not None or not job.terminal:
        return False
    return job.state == "succeeded" or (
        job.state == "failed" and job.reason not in ("timeout", "worker_lost", "preempted")
    )


def _end_machines(
    provider: Provider, r: InstanceRecord, nodes: list[InstanceRecord], *, finished: bool = False
) -> list[str]:
    ids = [n.instance_id for n in nodes if n.instance_id]
    if len(ids) < len(nodes):
        # The launch may have gone through without an answer: find it by its tag.
        tag = r.launch_id or r.request_id
        ids += [i.id for i in provider.list_owned({REQUEST_TAG: tag}) if i.id not in ids]
    if ids:
        if finished and isinstance(provider, FinishingProvider):
            provider.finish(ids)
        else:
            provider.terminate(ids)
        still = [i.id for i in provider.describe(ids) if i.state != "terminated"]
        if still:
            raise RuntimeError(f"{', '.join(still)} not terminated yet")
    return ids


def _later(ctx: StepContext, r: InstanceRecord, error: StepError) -> StepResult:
    why = error.text
    failures = ctx.fresh(r.request_id).step_failures + 1
    now = time.time()
    not_before = now + CLOUD_TERMINATE_RETRY.delay(failures)
    # The error has its own column: the outcome of the try stays what the next choice reads,
    # and the backoff survives a restart.
    ctx.store.update_instance(
        r.request_id,
        last_error=f"terminate failed: {why}",
        step_failures=failures,
        next_step_at=not_before,
    )
    log.warning("terminating %s failed (%s); retrying", r.request_id, why)
    if failures == 1:
        ctx.note(r.job_id, f"instance {r.request_id}: terminating failed ({why}); retrying")
    return step_result.failed("terminate", now, error, not_before=not_before)
