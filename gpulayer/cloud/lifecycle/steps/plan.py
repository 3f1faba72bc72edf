"""The plan step: a cloud job waiting for a machine gets its next offer (see
:func:`gpulayer.cloud.lifecycle.planning.choose`), written down with its reservation before
anything is created, and its launch started; or it waits for capacity until a time kept in the
store; or it moves to its next fallback target, or fails as unschedulable."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from gpulayer.cloud.fleets import FLEET_TAG
from gpulayer.cloud.lifecycle import gangs, planning
from gpulayer.cloud.lifecycle.placement import candidates
from gpulayer.cloud.lifecycle.steps.fleet import fleet_room, machines_held
from gpulayer.cloud.lifecycle.steps.plan_arrays import record_array
from gpulayer.cloud.lifecycle.steps.requested import requested_row
from gpulayer.cloud.lifecycle.steps.terminate import REQUEST_TAG
from gpulayer.cloud.lifecycle.world import HELD_FOR_NO_JOB

if TYPE_CHECKING:
    from gpulayer.cloud.lifecycle.ports import JobView
    from gpulayer.cloud.lifecycle.steps.context import StepContext
    from gpulayer.cloud.offer import Offer
    from gpulayer.cloud.protocol import Provider
    from gpulayer.spec import JobSpec

GANG_SIZE_TAG = "gpulayer:gang-size"

StartLaunch = Callable[[str, str], None]
"""Begins the launch step of a recorded instance (request id, job id)."""

PLACING = threading.Lock()
"""Plans run side by side: an offer that is one machine (an ssh host) goes to the first job
that records it, and a job planned at the same instant chooses again rather than reaching for
the same host."""


def plan_job(
    ctx: StepContext, job_id: str, start_launch: StartLaunch, together: Sequence[str] = ()
) -> None:
    """Plan the job; ``together``: other jobs of its array, recorded with it for one launch
    where its offer's provider makes arrays, else each planned on its own after it."""
    planned = _plan_job(ctx, job_id, start_launch, together)
    for other in together:
        if other not in planned:
            _plan_job(ctx, other, start_launch, ())


def _plan_job(
    ctx: StepContext, job_id: str, start_launch: StartLaunch, together: Sequence[str]
) -> set[str]:
    """The jobs planned: ``job_id``'s, and those of ``together`` recorded with it."""
    from gpulayer.spec import JobSpec

    job = ctx.store.get_job(job_id)
    if job.target != "cloud" or job.state not in ("queued", "provisioning"):
        return set()
    live = ctx.store.list_instances(live_only=True)
    # Its own idle machine (it is queued again for a retry) is no job's: it may take it back.
    if any(r.job_id == job_id and r.state not in HELD_FOR_NO_JOB for r in live):
        return set()
    spec = JobSpec.model_validate(job.spec)
    placement = spec.placement
    providers = ctx.load_providers(tuple(placement.providers))
    found = candidates(
        spec,
        providers,
        live,
        job_id,
        lambda text: ctx.note(job_id, text),
        wait_seconds=ctx.settings.get("cloud_wait_seconds"),
    )
    if found.never is not None:
        next_target_or_fail(ctx, job, spec, found.never)
        return set()
    if found.warm and _take_warm(ctx, job, found.warm, gangs.nodes_of(spec)):
        return set()
    now = time.time()
    # An offer inside a fleet's filter is the fleet's: a machine launched from it joins the
    # fleet, and none is launched once the fleet holds its max_nodes (the job waits for one).
    lone = gangs.nodes_of(spec) == 1
    full, joins = fleet_room(ctx, found.fitting, live) if lone else ({}, {})
    tries = planning.tries_of(ctx.store.list_instances(job_id=job_id))
    held = planning.held_offers(ctx.store.instances_holding_offers(now), now)
    freed_at = ctx.store.capacity_freed_at()
    provisioning = placement.provisioning

    def choose(unavailable: Mapping[planning.OfferKey, str]) -> planning.Decision:
        return planning.choose(
            found.fitting,
            tries,
            now=now,
            capacity_freed_at=freed_at,
            held_offers={**held, **full, **unavailable},
            busy=found.busy,
            freeing=[*found.freeing, *full.values()],
            queue=placement.on_unschedulable == "queue",
            wait_limit=provisioning.provisioning_timeout_seconds if provisioning else None,
            wait_started=job.created_at,
        )

    decision = choose({})
    if decision.offer is not None:
        with PLACING:
            # Again under the lock: a job planned meanwhile may have taken the host, or the
            # fleet's last room.
            taken = _machines_taken(ctx, job_id, providers)
            if lone:
                now_full, joins = fleet_room(
                    ctx, found.fitting, ctx.store.list_instances(live_only=True)
                )
                taken.update(now_full)
                full.update(now_full)
            if planning.offer_key(decision.offer) in taken:
                decision = choose(taken)
            if decision.offer is not None:
                ctx.store.end_capacity_waits([job_id])
                fleet = joins.get(planning.offer_key(decision.offer))
                arrayed = None
                if fleet is None:  # a fleet's machine is one job's: never an array's task
                    arrayed = record_array(
                        ctx, job, spec, decision.offer, together, start_launch, providers
                    )
                if arrayed is None:
                    _record(ctx, job, spec, decision.offer, start_launch, fleet)
                return arrayed or set()
    _wait_or_give_up(ctx, job, spec, decision, now, soon=bool(found.freeing or full))
    return set()


def _wait_or_give_up(
    ctx: StepContext,
    job: JobView,
    spec: JobSpec,
    decision: planning.Decision,
    now: float,
    *,
    soon: bool,
) -> None:
    """No offer now: the job waits for capacity until a time kept in the store (``soon``:
    machines free within a teardown, or idle ones a race took), or moves on."""
    if decision.wait is not None:
        retry_in = decision.retry_in or planning.backoff_seconds(1)
        if soon:
            retry_in = min(retry_in, planning.FREEING_RETRY_SECONDS)
        ctx.store.wait_for_capacity_until(job.id, now + retry_in)
        ctx.service.wait_for_capacity(job.id, decision.wait)
    else:
        next_target_or_fail(ctx, job, spec, decision.give_up or "no offer left")


def _take_warm(ctx: StepContext, job: JobView, warm: list[str], nodes: int = 1) -> bool:
    """The job takes the first of the idle machines that fit it that is still idle (a gang:
    ``nodes`` of them in one provider and region, all at once or none): no launch and no
    bootstrap, its workers bound to the job and the job dispatched to them now."""
    # Its teardown calls the provider with the credentials of the job that holds it: a job
    # sent with other credentials (another account) does not take it. A fleet's machine no
    # job took yet was rented with the control plane's own.
    mine = _credentials(ctx, job.id)
    live = {r.request_id: r for r in ctx.store.list_instances(live_only=True)}
    warm = [
        rid
        for rid in warm
        if rid in live and _credentials(ctx, live[rid].job_id) == mine and _worker_answers(ctx, rid)
    ]
    # A gang's nodes reach each other: its machines come from one provider and region.
    groups: dict[tuple[str, str | None], list[str]] = {}
    for rid in warm:
        groups.setdefault((live[rid].provider, live[rid].region), []).append(rid)
    choices = (
        [[rid] for rid in warm]
        if nodes == 1
        else [group[:nodes] for group in groups.values() if len(group) >= nodes]
    )
    reason = f"taken by job {job.id}"
    with PLACING:
        for taken in choices:
            if ctx.store.take_idle_instances(taken, job.id, reason=reason):
                break
        else:
            return False
    records = [ctx.store.get_instance(rid) for rid in taken]
    ctx.store.end_capacity_waits([job.id])
    where = ", ".join(
        f"{r.request_id} ({r.provider}/{r.zone or r.region}/{r.instance_type})" for r in records
    )
    what = "warm instance" if nodes == 1 else f"{nodes} warm instances together"
    ctx.service.hand_to_warm_machine(job.id, f"on {what} {where}: no launch and no bootstrap")
    ctx.wake()
    return True


def _credentials(ctx: StepContext, job_id: str) -> dict[str, str]:
    """The cloud variables a job's steps call providers with: its submit's, or (none sent, or
    no job) this process's own, as :func:`~gpulayer.cloud.credentials.using_environment`
    reads them."""
    import os

    from gpulayer.cloud.credentials import credential_variables

    sent = ctx.service.cloud_environment(job_id) if job_id else None
    return dict(sent) if sent else credential_variables(os.environ)


def _worker_answers(ctx: StepContext, request_id: str) -> bool:
    """Whether the idle machine's worker is heartbeating (ready): one that went silent (its
    dead-man switch stopped it while no controller ran) is left to its idle limit."""
    from gpulayer.errors import NotFoundError

    worker_id = ctx.worker_of(request_id)
    if worker_id is None:
        return False
    try:
        return ctx.store.get_worker(worker_id).state == "ready"
    except NotFoundError:
        return False


def _machines_taken(
    ctx: StepContext, job_id: str, providers: Mapping[str, Provider]
) -> dict[planning.OfferKey, str]:
    """Offers that are one machine and that another job's live instance holds now."""
    others = [r for r in ctx.store.list_instances(live_only=True) if r.job_id != job_id]
    return machines_held(others, providers)


def _record(
    ctx: StepContext,
    job: JobView,
    spec: JobSpec,
    offer: Offer,
    start_launch: StartLaunch,
    fleet: str | None = None,
) -> None:
    """Write the instance down (with its reservation) before anything is created."""
    from gpulayer.ids import new_id
    from gpulayer.ssh.keys import generate_keypair

    nodes = gangs.nodes_of(spec)
    request_ids = [new_id("r", 12) for _ in range(nodes)]
    request_id = request_ids[0]
    # One key for the gang: its nodes come from one launch call, which takes one key.
    keys = generate_keypair(ctx.keys_dir, request_id)
    tags = {"gpulayer:owner": ctx.owner, "gpulayer:job": job.id, REQUEST_TAG: request_id}
    if nodes > 1:
        tags[GANG_SIZE_TAG] = str(nodes)
    if fleet is not None:
        tags[FLEET_TAG] = fleet
    ctx.store.record_instances(
        [
            requested_row(
                offer,
                request_id=node_request,
                job_id=job.id,
                owner=ctx.owner,
                key_path=str(keys.private_path),
                tags=tags,
                launch_id=request_id if nodes > 1 else None,
                node_rank=rank,
                fleet=fleet,
            )
            for rank, node_request in enumerate(request_ids)
        ],
        reason=f"offer {offer.label} for job {job.id}"
        + (f" (gang of {nodes})" if nodes > 1 else ""),
    )
    what = offer.label if nodes == 1 else f"{nodes} x {offer.label}"
    if not ctx.service.begin_provisioning(job.id, f"provisioning {what}"):
        return  # cancelled meanwhile: the next pass ends the record as never launched
    start_launch(request_id, job.id)


def next_target_or_fail(ctx: StepContext, job: JobView, spec: JobSpec, why: str) -> None:
    target, refused = ctx.service.next_target(spec)
    if target is not None:
        moving = f"cloud: {why}; trying target {target}"
        ctx.note(job.id, moving)
        ctx.service.move_to_target(job.id, target, moving)
        return
    if refused:
        why = f"{why}; fallback: {'; '.join(refused)}"
    ctx.note(job.id, f"unschedulable: {why}")
    ctx.service.fail_unplaced(job.id, "unschedulable", why)
