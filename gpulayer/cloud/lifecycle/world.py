"""One pass's whole decision, pure: :func:`decide_pass` reads a :class:`World` (every live
instance's facts, with what its last step left in the store, the jobs waiting for a machine and
their waits for capacity) and returns one :class:`PassDecision`: each instance's actions in
order (its moves and the steps to start), the jobs to plan, the waits that ended, and the
follow-ups, each with the time before which nothing about it changes. As Nomad's reconciler
returns one result, the pass gathers the world, calls this once, carries the result out, and
sleeps no longer than the earliest follow-up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, NamedTuple

from gpulayer.cloud.lifecycle.arrays import (
    ARRAY_GATHER_SECONDS,
    ARRAY_MISSING_SECONDS,
    plan_groups,
)
from gpulayer.cloud.lifecycle.decide import (
    CHECK_EVERY_SECONDS,
    Action,
    InstanceFacts,
    Move,
    Step,
    Submit,
    decide,
    limit_of,
)
from gpulayer.cloud.lifecycle.states import (
    GONE,
    HOLDS_WORKER,
    PROVISIONING_STATES,
    STATE_TIMEOUTS,
    STUCK_STATES,
)

if TYPE_CHECKING:
    from gpulayer.cloud.fleets import FleetRule

HELD_FOR_NO_JOB = frozenset({"idle"})
"""An instance in these states is its last job's record but no job's machine: that job, when
it is queued again, is planned (and may take it back)."""


class Live(NamedTuple):
    """One live instance as the pass sees it (a tuple: a pass builds one per instance)."""

    request_id: str
    job_id: str
    facts: InstanceFacts


@dataclass(frozen=True)
class World:
    instances: Sequence[Live]
    waiting: Sequence[tuple[str, str]] = ()
    """Jobs waiting for a machine (queued or provisioning): (job id, target)."""
    capacity_waits: Mapping[str, float] = field(default_factory=dict)
    """Job id -> the time before which its next offer is not chosen (the store's waits)."""
    limits: Mapping[str, float] = field(default_factory=dict)
    """state_timeouts from the settings, over the state table's."""
    deadman_seconds: float = 600.0
    reap_due: bool = False
    fleets: Sequence[FleetRule] = ()
    """The named fleets configured now (providers.yaml's ``fleets:``)."""
    arrays: Mapping[str, tuple[str, float]] = field(default_factory=dict)
    """Waiting jobs of a job array: job id -> (array id, when the job was submitted); an
    array's jobs are planned together (see arrays.py)."""
    array_sizes: Mapping[str, int] = field(default_factory=dict)
    """Array id -> how many jobs it was made with, where its labels say."""


@dataclass(frozen=True)
class FollowUp:
    """Something the decision will do once the clock passes ``not_before``."""

    key: str
    """The instance's request id, or the waiting job's id."""
    not_before: float
    why: str


@dataclass(frozen=True)
class PassDecision:
    instances: Mapping[str, Sequence[Action]]
    """Each instance with actions, its actions in order (a move another controller won ends
    the rest)."""
    plan: tuple[str, ...] = ()
    """Jobs whose next offer is chosen now."""
    ended_waits: frozenset[str] = frozenset()
    """Waits for capacity of jobs that no longer wait (cancelled, planned elsewhere)."""
    follow_ups: tuple[FollowUp, ...] = ()
    reap: bool = False
    top_ups: tuple[tuple[str, int], ...] = ()
    """Fleets below their min_nodes: (fleet, how many machines to launch for it)."""
    plan_with: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """A job of ``plan`` -> the other jobs of its array planned with it (not in ``plan``)."""

    @property
    def moves(self) -> list[tuple[str, Move]]:
        return [
            (rid, a)
            for rid, actions in self.instances.items()
            for a in actions
            if isinstance(a, Move)
        ]

    @property
    def steps(self) -> list[tuple[str, Step]]:
        return [
            (rid, a.step)
            for rid, actions in self.instances.items()
            for a in actions
            if isinstance(a, Submit)
        ]

    def sleep_for(self, now: float, usual: float, shortest: float = 0.05) -> float:
        """How long the loop may sleep: its usual wake-up, or less when a follow-up is due
        sooner (never a busy loop)."""
        if not self.follow_ups:
            return usual
        earliest = min(f.not_before for f in self.follow_ups)
        return max(shortest, min(usual, earliest - now))


def fleet_wait_key(fleet: str) -> str:
    """A fleet's top-up that found no machine waits under this key among the jobs' waits for
    capacity (so the store keeps its backoff like theirs)."""
    return f"fleet:{fleet}"


def decide_pass(world: World, now: float) -> PassDecision:
    limits, deadman = world.limits, world.deadman_seconds
    acting: dict[str, Sequence[Action]] = {}
    follow_ups: list[FollowUp] = []
    instances, top_ups = _fleets(world, now, follow_ups)
    for request_id, _, facts in instances:
        actions = decide(facts, now, limits=limits, deadman_seconds=deadman)
        if actions:
            acting[request_id] = actions
        else:
            due = next_change(facts, now, limits, deadman)
            if due is not None:
                follow_ups.append(FollowUp(request_id, due[0], due[1]))
    busy = {live.job_id for live in world.instances if live.facts.state not in HELD_FOR_NO_JOB}
    waits = world.capacity_waits
    plan: list[str] = []
    for job_id, target in world.waiting:
        if target != "cloud" or job_id in busy:
            continue
        not_before = waits.get(job_id) if waits else None
        if not_before is None or not_before <= now:
            plan.append(job_id)
        else:
            follow_ups.append(FollowUp(job_id, not_before, "its wait for capacity ends"))
    kept = {fleet_wait_key(rule.name) for rule in world.fleets}
    ended = (
        frozenset(waits.keys() - {job_id for job_id, _ in world.waiting} - kept)
        if waits
        else frozenset()
    )
    plan = gathered(plan, world.arrays, world.array_sizes, now, follow_ups)
    firsts, together = plan_groups(plan, {job: a for job, (a, _) in world.arrays.items()})
    return PassDecision(
        acting, firsts, ended, tuple(follow_ups), world.reap_due, tuple(top_ups), together
    )


def gathered(
    plan: list[str],
    arrays: Mapping[str, tuple[str, float]],
    sizes: Mapping[str, int],
    now: float,
    follow_ups: list[FollowUp],
) -> list[str]:
    """The jobs of ``plan`` to plan now: an array's jobs wait until all of them wait (a
    client may send them one by one), then are planned together; see arrays.py for how long
    they wait for jobs that never come."""
    if not arrays:
        return plan
    newest: dict[str, float] = {}
    count: dict[str, int] = {}
    for array_id, created in arrays.values():
        newest[array_id] = max(created, newest.get(array_id, created))
        count[array_id] = count.get(array_id, 0) + 1
    ready: dict[str, float] = {}
    for array_id, last in newest.items():
        size = sizes.get(array_id)
        if size is not None and count[array_id] >= size:
            ready[array_id] = now
        else:
            wait = ARRAY_GATHER_SECONDS if size is None else ARRAY_MISSING_SECONDS
            ready[array_id] = last + wait
    kept = []
    for job_id in plan:
        array = arrays.get(job_id)
        ready_at = ready[array[0]] if array is not None else now
        if ready_at <= now:
            kept.append(job_id)
        else:
            follow_ups.append(FollowUp(job_id, ready_at, "its array's jobs are gathered"))
    return kept


def _fleets(
    world: World, now: float, follow_ups: list[FollowUp]
) -> tuple[Sequence[Live], list[tuple[str, int]]]:
    """The instances with their fleet's rule read into their facts (its idle_seconds, whether
    it is kept within min_nodes, whether its fleet is gone), and the fleets to top up."""
    if not world.fleets and not any(live.facts.fleet for live in world.instances):
        return world.instances, []
    from gpulayer.cloud.fleets import Machine, count_fleets

    rules = {rule.name: rule for rule in world.fleets}
    lives = world.instances
    count = count_fleets(
        (Machine(i.request_id, i.facts.fleet, i.facts.state, i.facts.since) for i in lives),
        world.fleets,
    )
    kept = count.kept
    top_ups: list[tuple[str, int]] = []
    for name, rule in rules.items():
        missing = rule.min_nodes - count.members[name]
        if missing <= 0:
            continue
        not_before = world.capacity_waits.get(fleet_wait_key(name))
        if not_before is not None and not_before > now:
            follow_ups.append(FollowUp(fleet_wait_key(name), not_before, "a fleet's top-up"))
        else:
            top_ups.append((name, missing))
    adjusted = []
    for live in world.instances:
        facts = live.facts
        if facts.fleet is not None:
            own = rules.get(facts.fleet)
            if own is None:
                facts = replace(facts, fleet_gone=True, job_ended=facts.job_ended or facts.no_job)
            else:
                facts = replace(
                    facts, idle_seconds=own.idle_seconds, idle_kept=live.request_id in kept
                )
            live = Live(live.request_id, live.job_id, facts)
        adjusted.append(live)
    return adjusted, top_ups


def next_change(
    facts: InstanceFacts, now: float, limits: Mapping[str, float], deadman_seconds: float
) -> tuple[float, str] | None:
    """The earliest time after ``now`` at which the clock alone may change what an instance
    that waits now is decided to do: its step's backoff ends, its state's limit (or its job's
    provisioning budget) runs out, its running job is due a check, its lost worker's
    dead-man time runs out. None when only news (a step's end, a job's) moves it."""
    state = facts.state
    if state in GONE:
        return None
    times: list[tuple[float, str]] = []
    if facts.next_step_at is not None and facts.next_step_at > now:
        times.append((facts.next_step_at, "its step's backoff ends"))
    if state in STUCK_STATES:
        limit = limit_of(facts, limits)
        if limit is not None:
            if state in PROVISIONING_STATES:
                limit = max(limit, facts.provisioning_budget)
            times.append((facts.since + limit, f"{state} reaches its limit"))
    if state == "ready" and STATE_TIMEOUTS["ready"] is not None:
        times.append((facts.since + STATE_TIMEOUTS["ready"], "ready reaches its limit"))
    if state in HOLDS_WORKER and facts.active_attempt is not None:
        times.append((facts.checked_at + CHECK_EVERY_SECONDS, "its running job is checked"))
    if state in HOLDS_WORKER and facts.unreachable_since is not None:
        times.append((facts.unreachable_since + deadman_seconds, "its worker is lost"))
    future = [t for t in times if t[0] > now]
    return min(future) if future else None
