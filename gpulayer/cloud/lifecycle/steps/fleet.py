"""The fleet steps: a fleet below its min_nodes gets machines of its own (written down before
anything is created, with no job, then launched and made workers that wait idle), and a job
planned onto an offer inside a fleet's filter learns whether the fleet has room for one more
machine (max_nodes).

The decision to top a fleet up is :func:`~gpulayer.cloud.lifecycle.world.decide_pass`'s; this
step finds the offer (I/O: the providers' offers) and records the machines.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from gpulayer.cloud.fleets import FLEET_TAG, fleet_spec
from gpulayer.cloud.lifecycle import planning
from gpulayer.cloud.lifecycle.placement import candidates
from gpulayer.cloud.lifecycle.states import GONE
from gpulayer.cloud.lifecycle.steps.requested import requested_row
from gpulayer.cloud.lifecycle.world import fleet_wait_key
from gpulayer.cloud.protocol import OffersAreMachines

if TYPE_CHECKING:
    from gpulayer.cloud.fleets import FleetSettings
    from gpulayer.cloud.lifecycle.records import InstanceRecord
    from gpulayer.cloud.lifecycle.steps.context import StepContext
    from gpulayer.cloud.offer import Offer
    from gpulayer.cloud.protocol import Provider

log = logging.getLogger("gpulayer.lifecycle")

RECENT_TRIES_SECONDS = 600.0
"""A fleet's failed tries of an offer keep it from that offer this long (a job's keep it for
the job's life; a fleet lives on)."""
NOTHING_FITS_RETRY_SECONDS = 60.0

_ENDING = frozenset({"draining", "terminating"}) | GONE


def members(live: Sequence[InstanceRecord], fleet: str) -> list[InstanceRecord]:
    """The fleet's machines that count against its min and max: live, not being torn down."""
    return [r for r in live if r.fleet == fleet and r.state not in _ENDING]


def fleet_room(
    ctx: StepContext, fitting: Sequence[Offer], live: Sequence[InstanceRecord]
) -> tuple[dict[planning.OfferKey, str], dict[planning.OfferKey, str]]:
    """For a job's fitting offers: those inside a fleet that holds its max_nodes already
    (unavailable, with why), and those inside a fleet with room (the fleet a machine launched
    from it joins)."""
    fleets: Sequence[FleetSettings] = ctx.settings.get("fleets") or ()
    full: dict[planning.OfferKey, str] = {}
    joins: dict[planning.OfferKey, str] = {}
    if not fleets:
        return full, joins
    for offer in fitting:
        fleet = fleet_of_offer(offer, fleets)
        if fleet is None:
            continue
        key = planning.offer_key(offer)
        if len(members(live, fleet.name)) >= fleet.most:
            full[key] = f"fleet {fleet.name} holds its max_nodes ({fleet.most})"
        else:
            joins[key] = fleet.name
    return full, joins


def fleet_of_offer(offer: Offer, fleets: Sequence[FleetSettings]) -> FleetSettings | None:
    """The first fleet whose filter the offer is inside, if any: a machine launched from it
    is that fleet's."""
    from gpulayer.cloud.offer import OfferQuery
    from gpulayer.cloud.ranking import rank
    from gpulayer.cloud.search import select

    for fleet in fleets:
        spec = fleet_spec(fleet)
        if select(rank([offer]), OfferQuery.from_spec(spec), spec.placement).offers:
            return fleet
    return None


def machines_held(
    live: Sequence[InstanceRecord], providers: Mapping[str, Provider]
) -> dict[planning.OfferKey, str]:
    """Offers that are one machine (an ssh host) and that a live instance holds now."""
    held: dict[planning.OfferKey, str] = {}
    for record in live:
        if record.offer and isinstance(providers.get(record.provider), OffersAreMachines):
            holder = f"job {record.job_id}" if record.job_id else f"fleet {record.fleet}"
            held[planning.offer_key(record.offer)] = f"in use by {holder}"
    return held


def top_up(
    ctx: StepContext,
    name: str,
    placing: AbstractContextManager[Any],
    start_launch: Callable[[str, str], None],
) -> None:
    """Launch the machines fleet ``name`` lacks below its min_nodes, or wait (a backoff kept
    in the store) when no offer is open. ``placing``: the lock that plans hold while they
    record a machine, so a job and the fleet never record the same host."""
    fleet = ctx.fleet(name)
    if fleet is None:
        return
    spec = fleet_spec(fleet)
    providers = ctx.load_providers(tuple(fleet.providers))
    live = ctx.store.list_instances(live_only=True)
    found = candidates(
        spec,
        providers,
        live,
        "",
        lambda text: log.info("fleet %s: %s", name, text),
        wait_seconds=ctx.settings.get("cloud_wait_seconds"),
    )
    now = time.time()
    if found.never is not None:
        return _wait(ctx, name, found.never, now + NOTHING_FITS_RETRY_SECONDS)
    tries = planning.tries_of(
        r
        for r in ctx.store.list_instances()
        if r.fleet == name and r.outcome is not None and now - r.created_at < RECENT_TRIES_SECONDS
    )
    held = planning.held_offers(ctx.store.instances_holding_offers(now), now)
    with placing:
        live = ctx.store.list_instances(live_only=True)
        missing = fleet.min_nodes - len(members(live, name))
        recorded = 0
        while recorded < missing:
            taken = machines_held(live, providers)
            decision = planning.choose(
                found.fitting, tries, now=now, held_offers={**held, **taken}, queue=True
            )
            if decision.offer is None:
                if decision.wait is not None:  # capacity or busy machines: its backoff
                    retry = now + (decision.retry_in or planning.backoff_seconds(1))
                    return _wait(ctx, name, decision.wait, retry)
                # Every offer failed lately: looked at again once they may have recovered.
                why = decision.give_up or "no offer left"
                return _wait(ctx, name, why, now + NOTHING_FITS_RETRY_SECONDS)
            record = _record(ctx, fleet, decision.offer)
            live = [*live, record]
            recorded += 1
            start_launch(record.request_id, "")
    ctx.store.end_capacity_waits([fleet_wait_key(name)])


def _wait(ctx: StepContext, name: str, why: str, not_before: float) -> None:
    log.warning("fleet %s: below its min_nodes: %s", name, why)
    ctx.store.wait_for_capacity_until(fleet_wait_key(name), not_before)


def _record(ctx: StepContext, fleet: FleetSettings, offer: Offer) -> InstanceRecord:
    """Write one machine of the fleet down (with its reservation, for no job) before
    anything is created."""
    from gpulayer.cloud.lifecycle.steps.terminate import REQUEST_TAG
    from gpulayer.ids import new_id
    from gpulayer.ssh.keys import generate_keypair

    request_id = new_id("r", 12)
    keys = generate_keypair(ctx.keys_dir, request_id)
    tags = {"gpulayer:owner": ctx.owner, REQUEST_TAG: request_id, FLEET_TAG: fleet.name}
    (record,) = ctx.store.record_instances(
        [
            requested_row(
                offer,
                request_id=request_id,
                job_id="",
                owner=ctx.owner,
                key_path=str(keys.private_path),
                tags=tags,
                fleet=fleet.name,
            )
        ],
        reason=f"offer {offer.label} for fleet {fleet.name} (below its min_nodes)",
    )
    log.info("fleet %s: launching %s", fleet.name, offer.label)
    return record
