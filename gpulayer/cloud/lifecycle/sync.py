"""A pass's "sync": the facts every live instance's decision reads, gathered from the store in
a few batched reads (jobs, reservations, the gangs' records, attempts, active attempts), not a
handful of queries per instance, plus the steps in flight (leases) and this process's links."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gpulayer.cloud.lifecycle import gangs
from gpulayer.cloud.lifecycle.arrays import ARRAY_LAUNCH_TAG, waits_for_array_call
from gpulayer.cloud.lifecycle.decide import InstanceFacts, stuck_soon
from gpulayer.cloud.lifecycle.states import HOLDS_WORKER

if TYPE_CHECKING:
    from gpulayer.cloud.lifecycle.ports import (
        AttemptView,
        InstanceStore,
        JobView,
        ReservationView,
    )
    from gpulayer.cloud.lifecycle.records import InstanceRecord


def launch_key(request_id: str) -> str:
    """The in-flight key of a launch: apart from the node's own steps, so the gang's other
    nodes can tell their launch is under way."""
    return f"launch:{request_id}"


def end_key(request_id: str) -> str:
    """Drain and terminate steps run under their own key, so a bootstrap still under way
    for the instance does not hold its teardown back."""
    return f"end:{request_id}"


@dataclass(frozen=True)
class Local:
    """What a pass reads beside the instances' rows: the steps in flight (the store's leases)
    and the links this process holds."""

    in_flight: Callable[[str], bool]
    link_alive: Callable[[str], bool]
    idle_seconds: Callable[[str], float] = lambda provider: 0.0
    """How long a provider's machines stay warm after their job (the settings in effect)."""


def provisioning_budget(job: JobView) -> float:
    """The job's provisioning_timeout_seconds, when it set one; 0 otherwise."""
    provisioning = (job.spec.get("placement") or {}).get("provisioning") or {}
    seconds = provisioning.get("provisioning_timeout_seconds")
    return float(seconds) if seconds is not None else 0.0


def gather(
    store: InstanceStore,
    records: Sequence[InstanceRecord],
    now: float,
    limits: Mapping[str, float],
    local: Local,
) -> list[InstanceFacts]:
    """The facts of each of ``records`` (live instances), in their order."""
    job_ids = sorted({r.job_id for r in records})
    jobs = {job.id: job for job in store.get_jobs(job_ids)}
    reservations = {r.request_id: r for r in store.reservations_of([r.request_id for r in records])}
    gang_jobs = sorted({r.job_id for r in records if r.launch_id is not None})
    gangs_of: dict[tuple[str, str], list[InstanceRecord]] = defaultdict(list)
    for node in store.instances_for_jobs(gang_jobs):
        if node.launch_id is not None:
            gangs_of[(node.job_id, node.launch_id)].append(node)
    holding = [r for r in records if r.state in HOLDS_WORKER]
    ran: dict[tuple[str, str | None], list[AttemptView]] = defaultdict(list)
    for attempt in store.attempts_for_jobs(sorted({r.job_id for r in holding})):
        ran[(attempt.job_id, attempt.worker_id)].append(attempt)
    workers = {
        reservation.worker_id
        for reservation in reservations.values()
        if reservation.worker_id is not None and reservation.state != "released"
    }
    active: dict[tuple[str, str | None], AttemptView] = {
        (a.job_id, a.worker_id): a for a in store.active_attempts_on(sorted(workers))
    }
    states = {r.request_id: r.state for r in records}
    facts = []
    for record in records:
        gang = gangs_of.get((record.job_id, record.launch_id or ""), [record])
        job = jobs.get(record.job_id)
        reservation = reservations.get(record.request_id)
        released = reservation is None or reservation.state == "released"
        found = _facts(record, now, limits, local, job, released, gang, ran, active, reservations)
        if found.array_call_pending and states.get(record.tags[ARRAY_LAUNCH_TAG]) == "launching":
            # The array's call may be made already (a restart cut its launch off): the task
            # waits for that launch, which the pass starts again, rather than count as never
            # launched.
            found = replace(found, launch_in_flight=True)
        facts.append(found)
    return facts


def _facts(
    r: InstanceRecord,
    now: float,
    limits: Mapping[str, float],
    local: Local,
    job: JobView | None,
    released: bool,
    gang: list[InstanceRecord],
    ran: Mapping[tuple[str, str | None], list[AttemptView]],
    active: Mapping[tuple[str, str | None], AttemptView],
    reservations: Mapping[str, ReservationView],
) -> InstanceFacts:
    rid = r.request_id
    worker_id = _worker_of(rid, reservations)
    launches = [node.request_id for node in gang]
    array_call_pending = waits_for_array_call(rid, r.state, r.tags or {})
    if array_call_pending:
        # Its array's call is another task's launch: it waits while that one is under way.
        launches.append(r.tags[ARRAY_LAUNCH_TAG])
    facts = InstanceFacts(
        state=r.state,
        since=r.state_since or r.created_at,
        node_rank=r.node_rank,
        in_gang=r.launch_id is not None,
        outcome=r.outcome,
        unreachable_since=r.unreachable_since,
        next_step_at=r.next_step_at,
        launch_in_flight=any(local.in_flight(launch_key(launch)) for launch in launches),
        step_in_flight=local.in_flight(rid),
        teardown_in_flight=local.in_flight(end_key(rid)),
        checked_at=r.checked_at or 0.0,
        idle_seconds=local.idle_seconds(r.provider) if r.state in HOLDS_WORKER else 0.0,
        fleet=r.fleet,
        no_job=not r.job_id,
        array_call_pending=array_call_pending,
    )
    if job is not None and stuck_soon(facts, now, limits):
        facts = replace(facts, provisioning_budget=provisioning_budget(job))
    if r.state in ("draining", "terminating"):
        return facts
    if r.state == "idle":  # its job is over; only its link and its idle limit bear on it
        return replace(facts, job_ended=True, link_alive=local.link_alive(rid), worker_id=worker_id)
    # A fleet's machine that no job took yet has no job to end; only its fleet's removal (read
    # by the pass) ends it.
    ended = (job is None and bool(r.job_id)) or (job is not None and job.terminal) or released
    facts = replace(
        facts,
        job_ended=ended,
        job_provisioning=job is not None and job.state == "provisioning",
        gang_broken=None if ended else gangs.broken_by(r, gang),
        gang_all_ready=gangs.all_ready(r, gang),
    )
    if r.state not in HOLDS_WORKER:
        return facts
    on_worker = ran.get((r.job_id, worker_id), []) if worker_id is not None else []
    if r.state == "ready":
        # Only attempts made since it became the job's machine: a job taking back its own warm
        # machine for a retry ran its earlier attempt on the same worker.
        became = r.state_since or r.created_at
        on_worker = [a for a in on_worker if a.created_at >= became]
    running = active.get((r.job_id, worker_id)) if worker_id is not None else None
    still_runs = False
    if r.launch_id is not None and running is None and not ended:
        still_runs = any(
            (r.job_id, _worker_of(node.request_id, reservations)) in active
            for node in gang
            if node.request_id != rid and _worker_of(node.request_id, reservations)
        )
    return replace(
        facts,
        link_alive=local.link_alive(rid),
        worker_id=worker_id,
        active_attempt=running.number if running is not None else None,
        worker_ran_attempt=bool(on_worker),
        ended_by_reclaim=bool(on_worker)
        and max(on_worker, key=lambda a: a.number).reason == "preempted",
        gang_still_runs=still_runs,
    )


def _worker_of(request_id: str, reservations: Mapping[str, ReservationView]) -> str | None:
    reservation = reservations.get(request_id)
    return reservation.worker_id if reservation is not None else None
