"""The reap step: machines a provider lists as this controller's that no record knows of (a
launch whose answer was lost, a controller that crashed between the call and the write) are
ended. Whether one is due is a lease in the store (``reap``, held REAP_EVERY_SECONDS), so
controllers on one store share one clock and a restart does not reap again at once."""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from gpulayer.cloud.lifecycle import step_result
from gpulayer.cloud.lifecycle.steps.terminate import REQUEST_TAG

if TYPE_CHECKING:
    from gpulayer.cloud.lifecycle.step_result import StepResult
    from gpulayer.cloud.lifecycle.steps.context import StepContext

log = logging.getLogger("gpulayer.lifecycle")

REAP_EVERY_SECONDS = 60.0
REAP_LEASE = "reap"


def reap_when_due(ctx: StepContext) -> StepResult:
    """Reap unless another controller (or this one) did within REAP_EVERY_SECONDS."""
    now = time.time()
    token = uuid.uuid4().hex
    if not ctx.store.take_lease(REAP_LEASE, token, now=now, expires_at=now + REAP_EVERY_SECONDS):
        return step_result.skipped("reap", now, "reaped within the last minute")
    # The lease is left to expire: it is the time of the last reap, not a step in flight.
    ended = reap_unknown(ctx)
    return step_result.done("reap", time.time(), f"{len(ended)} unknown machines ended")


def reap_unknown(ctx: StepContext, *, dry_run: bool = False) -> list[dict[str, Any]]:
    try:
        providers = ctx.load_providers(())
    except Exception as exc:
        log.warning("reaper: %s", exc)
        return []
    live = ctx.store.list_instances(live_only=True)
    known = {r.request_id for r in live}
    known_ids = {r.instance_id for r in live}
    ended = []
    for name, provider in providers.items():
        try:
            owned = provider.list_owned({"gpulayer:owner": ctx.owner})
        except Exception as exc:
            log.warning("reaper: listing %s failed: %s", name, exc)
            continue
        for instance in owned:
            if instance.tags.get(REQUEST_TAG) in known or instance.id in known_ids:
                continue
            ended.append(
                entry(
                    instance.tags.get(REQUEST_TAG),
                    name,
                    instance.id,
                    instance.tags.get("gpulayer:job"),
                )
            )
            if not dry_run:
                try:
                    provider.terminate([instance.id])
                except Exception as exc:
                    log.warning("reaper: terminating %s failed: %s", instance.id, exc)
    return ended


def entry(
    request_id: str | None, provider: str, instance_id: str | None, job_id: str | None
) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "provider": provider,
        "instance_id": instance_id,
        "job_id": job_id,
    }
