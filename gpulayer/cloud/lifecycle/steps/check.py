"""The check step: does the provider still have the machine a worker runs on? What it shows
is read by :func:`~gpulayer.cloud.lifecycle.results.machine_fate` and
:func:`~gpulayer.cloud.lifecycle.results.after_check`: still there, reclaimed (its job may
save its work for its grace first, then its attempt ends preempted) or lost."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from gpulayer.cloud.lifecycle import step_result
from gpulayer.cloud.lifecycle.results import after_check, error_of, machine_fate
from gpulayer.cloud.lifecycle.states import HOLDS_WORKER

if TYPE_CHECKING:
    from gpulayer.cloud.lifecycle.records import InstanceRecord
    from gpulayer.cloud.lifecycle.step_result import StepName, StepResult
    from gpulayer.cloud.lifecycle.steps.context import StepContext

log = logging.getLogger("gpulayer.lifecycle")


def check(ctx: StepContext, request_id: str) -> StepResult:
    r = ctx.fresh(request_id)
    if r.state not in HOLDS_WORKER:
        return step_result.skipped("check", time.time(), f"the instance is {r.state}")
    return look(ctx, r, "check")


def look(ctx: StepContext, r: InstanceRecord, step: StepName) -> StepResult:
    """Ask the provider about the machine and act on what it shows; the result's move_to is
    set when the machine was found gone and its worker let go."""
    provider = ctx.provider(r) if r.instance_id else None
    if provider is None or r.instance_id is None:
        return step_result.skipped(step, time.time(), "no provider to ask")
    try:
        found = [i for i in provider.describe([r.instance_id]) if i.id == r.instance_id]
    except Exception as exc:
        log.info("instance %s: describe failed (%s); checking again later", r.request_id, exc)
        return step_result.failed(step, time.time(), error_of(exc))
    instance = found[0] if found else None
    fate = machine_fate(instance, r.outcome)
    now = time.time()
    if fate == "there":
        return step_result.done(step, now, "the machine is there", found=fate)
    worker_id = ctx.worker_of(r.request_id)
    answers, grace = False, 30.0
    if fate == "reclaimed" and worker_id is not None:
        answers = bool(ctx.store.active_attempts(worker_id))
        answers = answers and ctx.store.get_worker(worker_id).state == "ready"
        if answers and r.job_id:
            grace = float(ctx.store.get_job(r.job_id).spec.get("grace_seconds", 30))
    reading = after_check(
        fate,
        now=now,
        where=f"{r.provider} {r.instance_id}",
        shown_state=instance.state if instance is not None else "gone",
        reclaimed_at=r.reclaimed_at,
        has_worker=worker_id is not None,
        worker_answers=answers,
        grace_seconds=grace,
    )
    if reading.remember_reclaim:
        ctx.remember_reclaim(r, now)
    if reading.reclaim_seen_at is not None:
        ctx.store.update_instance(r.request_id, reclaimed_at=reading.reclaim_seen_at)
        r.reclaimed_at = reading.reclaim_seen_at
        ctx.note(
            r.job_id,
            f"instance {r.request_id}: reclaimed by the provider; its job has up to "
            f"{grace:g} s to save its work",
        )
    if reading.forget_reclaim_seen:
        ctx.store.update_instance(r.request_id, reclaimed_at=None)
    if reading.lose is None:
        return step_result.done(step, now, "reclaimed; its job saves its work", found=fate)
    reason, why = reading.lose
    ctx.lose(r, worker_id, reason, why)
    return step_result.done(step, now, why, found=fate, move_to="draining")
