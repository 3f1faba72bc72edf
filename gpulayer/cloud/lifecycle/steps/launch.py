"""The launch step: one provider call for an instance (a gang's node 0 makes it for every node;
a job array's first task makes one more, which creates every task of the array).

Idempotent by request id, so a launch a restart cut off is made again safely. What the call
raised is kept as data (:func:`~gpulayer.cloud.lifecycle.results.error_of`) and read into the
gang's move by :func:`~gpulayer.cloud.lifecycle.results.failed_launch`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gpulayer.cloud.lifecycle import arrays, step_result
from gpulayer.cloud.lifecycle.results import after_config_error, error_of, failed_launch
from gpulayer.cloud.protocol import GangProvider
from gpulayer.errors import UsageError

if TYPE_CHECKING:
    from gpulayer.cloud.lifecycle.records import InstanceRecord
    from gpulayer.cloud.lifecycle.step_result import StepError, StepResult
    from gpulayer.cloud.lifecycle.steps.context import StepContext
    from gpulayer.cloud.offer import Offer
    from gpulayer.cloud.protocol import Instance, LaunchRequest, Provider
    from gpulayer.spec import JobSpec

DEFAULT_PROVISIONING_SECONDS = 600.0


def launch(ctx: StepContext, request_id: str) -> StepResult:
    from gpulayer.cloud.offer import Offer
    from gpulayer.ssh.keys import load_keypair

    r = ctx.fresh(request_id)
    gang = _launching_gang(ctx, r)
    if gang is None:
        return step_result.skipped("launch", time.time(), f"the instance is {r.state}")
    spec = ctx.spec_of(r)
    if spec is None:
        return step_result.skipped("launch", time.time(), f"fleet {r.fleet} is not configured")
    offer = Offer.model_validate(r.offer)
    provider = ctx.provider(r)
    if provider is None:
        return step_result.skipped("launch", time.time(), f"provider {r.provider} is not enabled")
    if r.tags.get(arrays.ARRAY_LAUNCH_TAG) == r.request_id:
        failed = _launch_array(ctx, r, spec, offer, provider)
        if failed is not None:
            return failed
    public_key = load_keypair(ctx.keys_dir, request_id).public_key
    count = len(gang)
    what = offer.label if count == 1 else f"{count} x {offer.label} together"
    each = " each" if count > 1 else ""
    ctx.note(r.job_id, f"launching {what} at {_price(offer)}{each}")
    try:
        instances = _call(
            provider, offer, request_for(ctx, r, spec, offer, count, public_key), count
        )
    except Exception as exc:
        return launch_failed(ctx, r, gang, offer, error_of(exc))
    return _launched(ctx, r, gang, offer, instances)


def _launching_gang(ctx: StepContext, r: InstanceRecord) -> list[InstanceRecord] | None:
    """The instance's gang (itself alone), every node moved to launching; None when the
    record moved on or its job ended (the next pass ends it)."""
    if r.state == "requested" and not ctx.move(r, "launching", "calling the provider"):
        return None
    if r.state != "launching" or (r.job_id and ctx.store.get_job(r.job_id).terminal):
        return None
    gang = sorted(ctx.gang(r), key=lambda node: node.node_rank)
    for node in gang:
        if node.state == "requested" and node.request_id != r.request_id:
            # The one call may create every node: each is launching from here on.
            ctx.move(node, "launching", f"node 0 ({r.request_id}) calls the provider")
    if any(node.state != "launching" for node in gang):
        return None  # a node ended meanwhile: the next pass ends the gang
    return gang


def request_for(
    ctx: StepContext, r: InstanceRecord, spec: JobSpec, offer: Offer, count: int, public_key: str
) -> LaunchRequest:
    from gpulayer.cloud.images import resolve_release
    from gpulayer.cloud.protocol import LaunchRequest

    provisioning = spec.placement.provisioning
    release = provisioning.release if provisioning else None
    return LaunchRequest(
        request_id=r.request_id,
        job_id=r.job_id or f"fleet-{r.fleet}",  # a fleet's machine: no job yet
        owner=ctx.owner,
        tags=r.tags,
        ssh_public_key=public_key,
        allowed_ssh_cidr=_ssh_cidr(ctx),
        image_release=release,
        image=dict(resolve_release(offer.provider, release).selector),
        disk_gb=int(spec.resources.disk_gb) if spec.resources.disk_gb else None,
        spot=offer.spot,
        time_limit_seconds=spec.timeout_seconds,
        provisioning_timeout_seconds=(
            provisioning.provisioning_timeout_seconds
            if provisioning
            else DEFAULT_PROVISIONING_SECONDS
        ),
        count=count,
        job_name=spec.name,
        progress=lambda text: _progress(ctx, r.job_id, text),
    )


def _call(provider: Provider, offer: Offer, request: LaunchRequest, count: int) -> list[Instance]:
    from gpulayer.cloud.errors import ProviderError

    if count == 1:
        instances = [provider.launch(offer, request)]
    elif isinstance(provider, GangProvider):
        instances = list(provider.launch_gang(offer, request))
    else:
        raise UsageError(f"provider {offer.provider} cannot launch {count} nodes together")
    if len(instances) != count:
        raise ProviderError(
            f"asked for {count} instances, the provider answered {len(instances)}",
            provider=offer.provider,
        )
    return instances


def launch_failed(
    ctx: StepContext, r: InstanceRecord, gang: list[InstanceRecord], offer: Offer, error: StepError
) -> StepResult:
    failed = failed_launch(error)
    now = time.time()
    ctx.end_nodes(gang, failed.to, failed.reason, failed.end, now)
    then = failed.then
    if failed.config:
        tries = [
            i
            for i in ctx.store.list_instances(job_id=r.job_id)
            if i.provider == offer.provider and i.outcome == "config"
        ]
        then = after_config_error(offer.provider, len(tries))
    ctx.note(r.job_id, f"{offer.label}: {error.text}; {then}")
    return step_result.failed("launch", now, error, move_to=failed.to)


def _launched(
    ctx: StepContext,
    r: InstanceRecord,
    gang: list[InstanceRecord],
    offer: Offer,
    instances: list[Instance],
) -> StepResult:
    count = len(gang)
    for node, instance in zip(gang, instances, strict=True):
        price = instance.hourly_price if instance.hourly_price is not None else offer.hourly_price
        ctx.move(
            node,
            "booting",
            f"launched {instance.id}" + (f" as node {node.node_rank}" if count > 1 else ""),
            instance_id=instance.id,
            ssh_host=instance.ssh_host,
            launched_at=time.time(),
            hourly_price=price,
            machine=instance.model_dump(mode="json"),
        )
    if count > 1:
        ctx.note(
            r.job_id,
            f"gang of {count} launched together: "
            + ", ".join(
                f"node {n.node_rank} on {i.id}" for n, i in zip(gang, instances, strict=True)
            ),
        )
    ids = ", ".join(i.id for i in instances)
    return step_result.done("launch", time.time(), f"launched {ids}", move_to="booting")


def _launch_array(
    ctx: StepContext, r: InstanceRecord, spec: JobSpec, offer: Offer, provider: Provider
) -> StepResult | None:
    """A job array's one call, made by its first task ``r`` (launching), which creates every
    task (see :mod:`gpulayer.cloud.lifecycle.arrays`); the other tasks then move to
    launching, where each task's own launch waits for its task to run. None once made (or
    when the provider makes no arrays: each task is launched on its own), else the failed
    launch, every task that waited for the call ended with it."""
    from gpulayer.ssh.keys import load_keypair

    tasks = sorted(
        (
            t
            for t in ctx.store.list_instances(live_only=True)
            if t.tags.get(arrays.ARRAY_LAUNCH_TAG) == r.request_id
            and t.state in ("requested", "launching")
        ),
        key=lambda t: int(t.tags.get(arrays.ARRAY_TASK_TAG, "0")),
    )
    others = [t for t in tasks if t.request_id != r.request_id]
    if isinstance(provider, arrays.ArrayProvider) and others:
        requests = [
            request_for(ctx, t, spec, offer, 1, load_keypair(ctx.keys_dir, t.request_id).public_key)
            for t in tasks
        ]
        limit = arrays.array_limit(r.tags)
        ctx.note(
            r.job_id,
            f"launching {len(tasks)} jobs of its array as one array of {offer.label}"
            + (f", at most {limit} at once" if limit else ""),
        )
        try:
            ids = provider.launch_array(offer, requests, limit)
        except Exception as exc:
            return launch_failed(ctx, r, tasks, offer, error_of(exc))
    else:
        ids = ["" for _ in tasks]
    made = dict(zip((t.request_id for t in tasks), ids, strict=True))
    for task in others:
        if task.state == "requested":
            what = f" as {made[task.request_id]}" if made[task.request_id] else ""
            ctx.move(task, "launching", f"its array's launch ({r.request_id}) made it{what}")
    return None


def _progress(ctx: StepContext, job_id: str, text: str) -> None:
    ctx.note(job_id, text)
    if text.startswith("waiting for capacity"):
        # A launch that waits in a provider's queue says why in the job's status too.
        ctx.service.begin_provisioning(job_id, text)


def _ssh_cidr(ctx: StepContext) -> str:
    configured = ctx.settings.get("ssh_cidr")
    if configured:
        return str(configured)
    from gpulayer.cloud.network import controller_cidr

    return controller_cidr()


def _price(offer: Offer) -> str:
    if offer.hourly_price is None:
        return "an unknown price"
    return f"{offer.hourly_price} {offer.currency}/h"
