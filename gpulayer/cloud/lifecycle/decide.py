"""The next step of one rented instance, decided from a snapshot of it and what bears on it.

Pure, as Nomad's reconciler is: :func:`decide` reads an :class:`InstanceFacts` (the record,
its job and reservation, its gang, its worker's link and attempt, the steps in flight, the
clock) and returns :class:`Action` values; it writes nothing and calls nothing. The reconciler
gathers the facts (a pass's "sync"), calls it, and carries the actions out (its "step"), each
state change recorded with its reason. Property tests drive it without any I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Literal

from gpulayer.cloud.lifecycle.states import (
    GONE,
    HOLDS_WORKER,
    PROVISIONING_STATES,
    STATE_TIMEOUTS,
    idle_limit,
    stuck_move,
    timed_out,
)

Step = Literal["launch", "prepare", "reconnect", "check", "drain", "terminate"]
"""Steps that run in a pool and end in a state change of their own (launch and the two
teardown steps in pools of their kind)."""

CHECK_EVERY_SECONDS = 5.0


@dataclass(frozen=True)
class InstanceFacts:
    """One instance as a pass sees it. Fields a state does not consult keep their defaults
    (the pass does not read them from the store)."""

    state: str
    since: float
    """When it entered ``state``."""
    node_rank: int = 0
    in_gang: bool = False
    outcome: str | None = None
    unreachable_since: float | None = None
    next_step_at: float | None = None
    """A failed step's backoff (a terminate, a tunnel not reopened), kept in the store."""
    job_ended: bool = False
    """Its job is over, or its reservation is gone or released: nobody will use it."""
    job_provisioning: bool = False
    gang_broken: str | None = None
    """Why its gang ends: another node is ending or gone."""
    gang_all_ready: bool = True
    launch_in_flight: bool = False
    """Its launch call (a gang's: node 0's, for every node) is under way (a lease is held on
    it, by this controller or another)."""
    step_in_flight: bool = False
    teardown_in_flight: bool = False
    provisioning_budget: float = 0.0
    """The job's provisioning_timeout_seconds (0: none), which may hold a provisioning state
    past the table's limit."""
    link_alive: bool = False
    worker_id: str | None = None
    active_attempt: int | None = None
    """The number of the job's attempt running on its worker."""
    worker_ran_attempt: bool = False
    """Some attempt of the job ran on its worker."""
    gang_still_runs: bool = False
    """Another node of its gang still runs its part."""
    ended_by_reclaim: bool = False
    """The last attempt on its worker ended preempted (the worker said its machine went)."""
    checked_at: float = 0.0
    idle_seconds: float = 0.0
    """How long its provider keeps a machine warm after its job (0: it drains at once); a
    fleet's machine: its fleet's idle_seconds."""
    fleet: str | None = None
    """The named fleet it belongs to."""
    no_job: bool = False
    """A fleet's machine no job has taken yet: it is made a worker, then waits idle."""
    idle_kept: bool = False
    """An idle fleet machine within its fleet's min_nodes: no idle limit ends it."""
    fleet_gone: bool = False
    """Its fleet is no longer configured: it ends once no job uses it."""
    array_call_pending: bool = False
    """A job array's task whose array's one launch call (another task's) is not made yet."""


@dataclass(frozen=True)
class Move:
    to: str
    reason: str
    failed_try: bool = False
    """The offer counts as failed for the job (the try's outcome columns say so)."""
    announce: bool = False
    """Logged as a warning and noted on the job (a stuck instance)."""

    @property
    def gone(self) -> bool:
        """Nothing is left in the cloud after it: its keys and link go."""
        return self.to in GONE


@dataclass(frozen=True)
class Submit:
    step: Step


@dataclass(frozen=True)
class Release:
    """No one may be dispatched to its worker now; the instance drains."""

    why: str


@dataclass(frozen=True)
class Rest:
    """Its job is done with it, but it stays warm: no one may be dispatched to its worker until
    a job takes it, and it is idle (its worker runs on) until its idle_seconds pass."""

    why: str


@dataclass(frozen=True)
class LoseWorker:
    """Its worker's attempts end (``reason``), the job is told, and the instance drains."""

    reason: str
    why: str


@dataclass(frozen=True)
class EndGangNode:
    """Its gang ends: its worker's running attempt ends lost, and the instance drains."""

    why: str
    end_attempt: bool


@dataclass(frozen=True)
class MarkUnreachable:
    at: float


@dataclass(frozen=True)
class MarkReachable:
    pass


@dataclass(frozen=True)
class RememberReclaim:
    """The provider took the machine back: the try's outcome says so and its offer is held."""


@dataclass(frozen=True)
class HandOver:
    """Its job goes to its reserved worker(s)."""


_SUBMIT: dict[str, Submit] = {
    step: Submit(step) for step in ("launch", "prepare", "reconnect", "check", "drain", "terminate")
}
_ONLY: dict[str, tuple[Action, ...]] = {step: (submit,) for step, submit in _SUBMIT.items()}
"""One value per step, and per step alone: a pass over many instances allocates none for the
commonest decisions (they are frozen), which keeps a pass's garbage collector quiet."""

Action = (
    Move
    | Submit
    | Release
    | Rest
    | LoseWorker
    | EndGangNode
    | MarkUnreachable
    | MarkReachable
    | RememberReclaim
    | HandOver
)


def decide(
    facts: InstanceFacts,
    now: float,
    *,
    limits: Mapping[str, float] | None = None,
    deadman_seconds: float,
) -> Sequence[Action]:
    """The actions for the instance now, in order; empty when it waits."""
    if facts.state in GONE:
        return ()
    stuck = _stuck(facts, now, limits or {})
    if stuck is not None:
        return [stuck]
    if (facts.next_step_at or 0) > now:
        return ()  # its failed step waits for its backoff
    if facts.state == "idle":
        return () if facts.step_in_flight else _idle_step(facts, now, deadman_seconds)
    if facts.state in ("draining", "terminating"):
        # Teardown waits for its own step only: not for a bootstrap, nor for a gang's launch
        # call (what that call creates after the terminate is found by its tags and reaped).
        return () if facts.teardown_in_flight else _next(facts, now, deadman_seconds)
    if facts.step_in_flight:
        # A job that ended while its machine is still being made a worker: the machine goes
        # now; the bootstrap, when it returns, finds the instance moved on and stops.
        if facts.state in ("booting", "bootstrapping") and facts.job_ended:
            return [Move("draining", f"its job ended while {facts.state}")]
        return ()
    if facts.in_gang and facts.launch_in_flight:
        return ()  # its gang's launch moves every node itself
    if facts.gang_broken is not None and not facts.job_ended:
        return _end_with_gang(facts, facts.gang_broken)
    return _next(facts, now, deadman_seconds)


def limit_of(facts: InstanceFacts, limits: Mapping[str, float]) -> float | None:
    """The time limit of the instance's state: the settings' over the table's; an idle one's
    is its provider's idle_seconds."""
    if facts.state == "idle":
        return None if facts.idle_kept else idle_limit(facts.idle_seconds)
    return limits.get(facts.state, STATE_TIMEOUTS.get(facts.state))


def _stuck(facts: InstanceFacts, now: float, limits: Mapping[str, float]) -> Move | None:
    if facts.state == "idle":
        if facts.idle_kept or facts.fleet_gone:
            return None  # within its fleet's min_nodes: kept up (a gone fleet's: released)
        limit = idle_limit(facts.idle_seconds)
        idle = stuck_move("idle", facts.since, now, {} if limit is None else {"idle": limit})
        if limit is None or idle is None:
            return None
        return Move(idle.to, f"idle for {limit:g} s: no job took it")
    if facts.state == "requested" and facts.launch_in_flight:
        # Its launch waits for a thread behind launches that wait on their provider (Slurm
        # allocations pending in a busy queue): queued, not stuck.
        return None
    move = stuck_move(facts.state, facts.since, now, limits)
    if move is None:
        return None
    if facts.state in PROVISIONING_STATES and now - facts.since <= facts.provisioning_budget:
        return None  # the job allows more (a queue that may hold it for hours)
    return Move(
        move.to, move.reason, failed_try=move.failed_try and facts.node_rank == 0, announce=True
    )


def stuck_soon(facts: InstanceFacts, now: float, limits: Mapping[str, float]) -> bool:
    """Whether the table's limit alone would move it: the pass then reads the job's own
    provisioning budget, which only a provisioning state past its limit needs."""
    return facts.state in PROVISIONING_STATES and (
        stuck_move(facts.state, facts.since, now, limits) is not None
    )


def _end_with_gang(facts: InstanceFacts, why: str) -> list[Action]:
    """Another node of the gang failed or ended: this one goes too, whatever its state."""
    if facts.state == "requested":
        return [Move("never_launched", why)]
    if facts.state == "launching":
        return [Move("terminating", why)]
    if facts.state in HOLDS_WORKER:
        running = facts.worker_id is not None and facts.active_attempt is not None
        return [EndGangNode(why, end_attempt=running)]
    if facts.state in ("booting", "bootstrapping"):
        return [Move("draining", why)]
    return []  # already ending: a broken gang never names an ending node


def _next(facts: InstanceFacts, now: float, deadman_seconds: float) -> Sequence[Action]:
    state, ended = facts.state, facts.job_ended
    # Node 0's record launches the whole gang; the other nodes wait for it, as an array's
    # tasks wait for the task that makes the array's call.
    launches = facts.node_rank == 0 and not facts.array_call_pending
    if state == "requested":
        if ended:
            return [Move("never_launched", "its job ended before the launch")]
        return _ONLY["launch"] if launches else ()
    if state == "launching":
        if ended:
            return [Move("terminating", "its job ended during the launch")]
        return _ONLY["launch"] if launches else ()  # a launch is idempotent by request id
    if state in ("booting", "bootstrapping"):
        if ended:
            return [Move("draining", f"its job ended while {state}")]
        if state == "bootstrapping":
            # Only a step of this process bootstraps, and none does: a restart cut it off.
            restart = "the controller restarted mid-bootstrap; starting over"
            return [Move("booting", restart), _SUBMIT["prepare"]]
        return _ONLY["prepare"]
    if state in HOLDS_WORKER:
        return _worker_step(facts, now, deadman_seconds)
    if state == "draining":
        return _ONLY["drain"]
    if state == "terminating":
        return _ONLY["terminate"]
    return ()


def _let_go(facts: InstanceFacts, why: str) -> Release | Rest:
    """Its job is done with it: a healthy machine whose provider keeps machines warm, or a
    fleet's, rests (idle) for the next job (a fleet's past its idle limit drains from there);
    any other drains. A gang's nodes get here once none of them runs its part, so they rest
    (or drain) together."""
    warm = (
        (facts.idle_seconds > 0 or facts.fleet is not None)
        and not facts.fleet_gone
        and facts.link_alive
        and facts.outcome is None
        and not facts.ended_by_reclaim
    )
    return Rest(why) if warm else Release(why)


def _link_step(
    facts: InstanceFacts, now: float, deadman_seconds: float, actions: list[Action]
) -> list[Action] | None:
    """A lost link: reopen it until the dead-man time runs out, then the worker is lost (the
    actions to return); None when the link is up."""
    if not facts.link_alive:
        first = facts.unreachable_since
        if first is None:
            first = now
            actions.append(MarkUnreachable(now))
        if now - first > deadman_seconds:
            why = "its instance could not be reached again"
            return [*actions, LoseWorker("worker_lost", why)]
        return [*actions, _SUBMIT["reconnect"]]
    if facts.unreachable_since is not None:
        actions.append(MarkReachable())
    return None


def _idle_step(facts: InstanceFacts, now: float, deadman_seconds: float) -> list[Action]:
    """A warm machine waits for a job (the plan step takes it) or its idle limit (the stuck
    pass); its worker's link is kept, or the worker lost, as while it runs a job."""
    if facts.fleet_gone:
        return [Release(f"its fleet {facts.fleet} is no longer in providers.yaml")]
    actions: list[Action] = []
    lost = _link_step(facts, now, deadman_seconds, actions)
    return actions if lost is None else lost


def _worker_step(facts: InstanceFacts, now: float, deadman_seconds: float) -> list[Action]:
    actions: list[Action] = []
    if facts.job_ended:
        # The worker may have said its machine was going before this pass saw the job end.
        if facts.outcome != "reclaimed" and facts.ended_by_reclaim:
            actions.append(RememberReclaim())
        return [*actions, _let_go(facts, "its job ended")]
    lost = _link_step(facts, now, deadman_seconds, actions)
    if lost is not None:
        return lost
    if facts.state == "ready":
        return actions + _ready_step(facts, now)
    if facts.active_attempt is None:
        if facts.in_gang and facts.gang_still_runs:
            return actions  # its node is done; the gang's machines go together when all are
        if facts.ended_by_reclaim:
            actions.append(RememberReclaim())
        return [*actions, _let_go(facts, "its job's attempt ended")]
    if now - facts.checked_at > CHECK_EVERY_SECONDS:
        actions.append(_SUBMIT["check"])
    return actions


def _ready_step(facts: InstanceFacts, now: float) -> list[Action]:
    if facts.no_job:
        return [Rest(f"made a worker for fleet {facts.fleet}")]
    if facts.active_attempt is not None:
        return [Move("in_use", f"attempt {facts.active_attempt} started on its worker")]
    if facts.worker_ran_attempt:
        if facts.in_gang and facts.gang_still_runs:
            return []  # its part ran between two passes; the others still run theirs
        return [_let_go(facts, "its job's attempt ended")]
    # A gang's nodes are handed over together, once the last one is ready.
    if facts.gang_all_ready and timed_out("ready", facts.since, now):
        return [Release("its job was not dispatched to its worker in time")]
    if facts.gang_all_ready and facts.job_provisioning:
        return [HandOver()]
    return []


def jobs_to_plan(
    waiting: Iterable[tuple[str, str]],
    with_instances: Set[str],
    retry_at: Mapping[str, float],
    now: float,
) -> list[str]:
    """Of the jobs waiting for a machine (id, target), those whose offer is to be chosen now:
    cloud jobs holding no live instance, past the time their last wait for capacity set."""
    return [
        job_id
        for job_id, target in waiting
        if target == "cloud" and job_id not in with_instances and retry_at.get(job_id, 0) <= now
    ]
