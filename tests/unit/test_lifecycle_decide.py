"""The lifecycle's decision, driven without any I/O: examples for each state, and properties
over any instance (hypothesis) with a model of the steps carrying the actions out."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulayer.cloud.lifecycle import planning
from gpulayer.cloud.lifecycle.decide import (
    EndGangNode,
    HandOver,
    InstanceFacts,
    LoseWorker,
    MarkReachable,
    MarkUnreachable,
    Move,
    Release,
    RememberReclaim,
    Rest,
    Submit,
    decide,
    jobs_to_plan,
)
from gpulayer.cloud.lifecycle.states import (
    GONE,
    HOLDS_WORKER,
    PROVISIONING_STATES,
    STATE_TIMEOUTS,
    STATES,
    TRANSITIONS,
)
from gpulayer.cloud.offer import Offer

IDLE_MAX = 2_000.0
DEADMAN = 600.0
LIVE = [s for s in STATES if s not in GONE]
WORKER_ACTIONS = (
    Release,
    LoseWorker,
    EndGangNode,
    HandOver,
    MarkReachable,
    MarkUnreachable,
    RememberReclaim,
    Rest,
)

facts_strategy = st.builds(
    InstanceFacts,
    state=st.sampled_from(STATES),
    since=st.floats(0, 10_000),
    node_rank=st.integers(0, 3),
    in_gang=st.booleans(),
    outcome=st.sampled_from([None, "capacity", "failed", "reclaimed"]),
    unreachable_since=st.none() | st.floats(0, 10_000),
    next_step_at=st.none() | st.floats(0, 20_000),
    job_ended=st.booleans(),
    job_provisioning=st.booleans(),
    gang_broken=st.none() | st.just("node 1 of its gang is draining"),
    gang_all_ready=st.booleans(),
    launch_in_flight=st.booleans(),
    step_in_flight=st.booleans(),
    teardown_in_flight=st.booleans(),
    provisioning_budget=st.floats(0, 5_000),
    link_alive=st.booleans(),
    worker_id=st.none() | st.just("w-1"),
    active_attempt=st.none() | st.integers(1, 3),
    worker_ran_attempt=st.booleans(),
    gang_still_runs=st.booleans(),
    ended_by_reclaim=st.booleans(),
    checked_at=st.floats(0, 20_000),
    idle_seconds=st.just(0.0) | st.floats(1, IDLE_MAX),
)


def _decide(facts: InstanceFacts, now: float) -> list[object]:
    return list(decide(facts, now, deadman_seconds=DEADMAN))


# --- properties ------------------------------------------------------------------------------


@given(facts_strategy.filter(lambda f: f.state in GONE), st.floats(0, 10**7))
def test_no_action_on_a_gone_instance(facts: InstanceFacts, now: float) -> None:
    assert _decide(facts, now) == []


@given(facts_strategy, st.floats(0, 30_000))
def test_every_action_is_one_the_state_allows(facts: InstanceFacts, now: float) -> None:
    actions = _decide(facts, now)
    moves = [a for a in actions if isinstance(a, Move)]
    assert len(moves) <= 1
    for move in moves:
        assert move.to in TRANSITIONS[facts.state], (facts.state, move)
    if any(isinstance(a, WORKER_ACTIONS) for a in actions):
        assert facts.state in HOLDS_WORKER
    for action in actions:
        if isinstance(action, Submit) and action.step == "launch":
            assert facts.node_rank == 0 and facts.state in ("requested", "launching")
            assert not facts.job_ended


class World:
    """A model of the steps: each action done as the reconciler's executors do it, with
    provisioning steps that may hang for good and teardown steps that finish."""

    def __init__(self, facts: InstanceFacts, *, hang: bool) -> None:
        self.facts = facts
        self.hang = hang

    def move(self, to: str, now: float) -> None:
        assert to in TRANSITIONS[self.facts.state], (self.facts.state, to)
        self.facts = replace(self.facts, state=to, since=now)

    def apply(self, actions: list[object], now: float) -> None:
        for action in actions:
            if isinstance(action, Move):
                self.move(action.to, now)
            elif isinstance(action, (Release, LoseWorker, EndGangNode)):
                self.move("draining", now)
            elif isinstance(action, Rest):
                self.move("idle", now)
            elif isinstance(action, MarkUnreachable):
                self.facts = replace(self.facts, unreachable_since=action.at)
            elif isinstance(action, MarkReachable):
                self.facts = replace(self.facts, unreachable_since=None)
            elif isinstance(action, Submit):
                self.step(action.step, now)

    def step(self, step: str, now: float) -> None:
        state = self.facts.state
        if step == "drain":
            self.move("terminating", now)
        elif step == "terminate":
            self.move("terminated", now)
        elif step == "launch":
            if state == "requested":
                self.move("launching", now)
            if self.hang:
                self.facts = replace(self.facts, launch_in_flight=True)
            else:
                self.move("booting", now)
        elif step == "prepare":
            if self.hang:
                self.facts = replace(self.facts, step_in_flight=True)
                if state == "booting":
                    self.move("bootstrapping", now)
            else:
                self.move("bootstrapping", now)
                self.move("ready", now)
        elif step == "reconnect" and not self.hang:
            self.facts = replace(self.facts, link_alive=True)


def _passes_past_every_limit(tick: float, budget: float) -> int:
    """Enough passes for the clock to pass two of the longest limits, the job's budget and the
    longest idle_seconds drawn (idle's own limit in the table is a day)."""
    longest = max(
        limit for state, limit in STATE_TIMEOUTS.items() if limit is not None and state != "idle"
    )
    return int((2 * longest + budget + IDLE_MAX + 1_000) / tick) + 20


def _run(world: World, now: float, *, passes: int, tick: float, end_job_at: int) -> float:
    for n in range(passes):
        if world.facts.state in GONE:
            break
        if n == end_job_at:
            world.facts = replace(world.facts, job_ended=True)
        world.apply(_decide(world.facts, now), now)
        now += tick
    return now


@settings(max_examples=300, deadline=None)
@given(
    state=st.sampled_from(LIVE),
    facts=facts_strategy,
    hang=st.booleans(),
    end_job_at=st.integers(0, 10),
    tick=st.floats(1, 400),
)
def test_with_its_job_ended_every_live_state_reaches_a_gone_one(
    state: str, facts: InstanceFacts, hang: bool, end_job_at: int, tick: float
) -> None:
    """Whatever the provisioning steps do (finish, or hang for good), once its job is over an
    instance ends gone: a hung bootstrap holds no teardown back, and a gang's hung launch call
    at most until the launching state's limit."""
    start = replace(
        facts,
        state=state,
        since=0.0,
        next_step_at=None,
        step_in_flight=False,
        teardown_in_flight=False,
        launch_in_flight=False,
        gang_broken=None,
    )
    world = World(start, hang=hang)
    _run(
        world,
        1.0,
        passes=_passes_past_every_limit(tick, start.provisioning_budget),
        tick=tick,
        end_job_at=end_job_at,
    )
    assert world.facts.state in GONE, world.facts


@settings(max_examples=200, deadline=None)
@given(
    state=st.sampled_from(["requested", "launching", "booting", "bootstrapping"]),
    facts=facts_strategy,
    tick=st.floats(1, 400),
)
def test_a_provisioning_step_that_hangs_for_good_is_ended_by_its_time_limit(
    state: str, facts: InstanceFacts, tick: float
) -> None:
    """Nothing ends the job and every launch and bootstrap hangs: the stuck pass still takes
    the instance to a gone state once the state's limit (and the job's budget) ran out."""
    start = replace(
        facts,
        state=state,
        since=0.0,
        node_rank=0,
        job_ended=False,
        gang_broken=None,
        next_step_at=None,
        launch_in_flight=False,
        step_in_flight=False,
        teardown_in_flight=False,
        provisioning_budget=min(facts.provisioning_budget, 1_000.0),
    )
    world = World(start, hang=True)
    _run(
        world,
        1.0,
        passes=_passes_past_every_limit(tick, start.provisioning_budget),
        tick=tick,
        end_job_at=10**9,
    )
    assert world.facts.state in GONE, world.facts


class HangingWorld(World):
    """A model of the steps in which the step begun in any chosen state never returns: in
    ``requested`` the launch never starts, in ``launching`` the provider's call never answers,
    in ``booting`` SSH never answers, in ``bootstrapping`` the install never ends, in ``ready``
    the hand-over never dispatches, in ``in_use`` the check hangs, and in ``draining`` and
    ``terminating`` the teardown call never returns. Steps begun elsewhere finish."""

    def __init__(self, facts: InstanceFacts, *, hang_at: frozenset[str]) -> None:
        super().__init__(facts, hang=False)
        self.hang_at = hang_at

    def hangs(self) -> bool:
        return self.facts.state in self.hang_at

    def apply(self, actions: list[object], now: float) -> None:
        for action in actions:
            if isinstance(action, HandOver) and not self.hangs():
                self.facts = replace(self.facts, active_attempt=1, worker_id="w-1")
            elif not isinstance(action, HandOver):
                super().apply([action], now)

    def step(self, step: str, now: float) -> None:
        if step == "launch":
            self._launch(now)
        elif step == "prepare":
            self._prepare(now)
        elif step in ("drain", "terminate"):
            if self.hangs():
                self.facts = replace(self.facts, teardown_in_flight=True)
            else:
                super().step(step, now)
        elif step in ("check", "reconnect") and self.hangs():
            self.facts = replace(self.facts, step_in_flight=True)

    def _launch(self, now: float) -> None:
        if self.facts.launch_in_flight or self.hangs():
            return  # a launch under way, or (in requested) one that never starts
        if self.facts.state == "requested":
            self.move("launching", now)
        if self.hangs():
            self.facts = replace(self.facts, launch_in_flight=True)
        else:
            self.move("booting", now)

    def _prepare(self, now: float) -> None:
        if self.facts.step_in_flight:
            return
        if self.hangs():  # booting: SSH never answers
            self.facts = replace(self.facts, step_in_flight=True)
            return
        if self.facts.state == "booting":
            self.move("bootstrapping", now)
        if self.hangs():  # bootstrapping: the install never ends
            self.facts = replace(self.facts, step_in_flight=True)
            return
        self.move("ready", now)


LIMITS = dict(STATE_TIMEOUTS)
"""The limits as documented, kept before any test takes one out of the live table."""
LIMITED = [state for state, limit in LIMITS.items() if limit is not None]
UNBOUNDED = {state for state in LIVE if LIMITS[state] is None}


def _longest_stay(state: str, budget: float, idle_seconds: float) -> float:
    limit = LIMITS[state]
    assert limit is not None
    if state == "idle":  # its provider's idle_seconds, within the table's limit
        return min(limit, idle_seconds)
    return max(limit, budget) if state in PROVISIONING_STATES else limit


@settings(max_examples=300, deadline=None)
@given(
    state=st.sampled_from(LIVE),
    hang_at=st.frozensets(st.sampled_from(LIVE)),
    facts=facts_strategy,
    tick=st.floats(5, 400),
)
def test_no_state_outlasts_its_limit_whichever_steps_hang(
    state: str, hang_at: frozenset[str], facts: InstanceFacts, tick: float
) -> None:
    """Steps that hang at any state (SSH never answering included) hold an instance in a state
    at most for that state's limit (a provisioning state: or the job's budget) and one pass;
    the instance ends where only its job or the reaper moves it on (in use, terminating) or
    gone."""
    start = replace(
        facts,
        state=state,
        since=0.0,
        node_rank=0,
        in_gang=False,
        job_ended=False,
        gang_broken=None,
        gang_all_ready=True,
        link_alive=True,
        unreachable_since=None,
        next_step_at=None,
        launch_in_flight=False,
        step_in_flight=False,
        teardown_in_flight=False,
        provisioning_budget=min(facts.provisioning_budget, 1_000.0),
    )
    world = HangingWorld(start, hang_at=hang_at)
    now = 1.0
    for _ in range(_passes_past_every_limit(tick, start.provisioning_budget)):
        current = world.facts
        if current.state in GONE:
            break
        if current.state in LIMITS and LIMITS[current.state] is not None:
            stayed = now - current.since
            longest = _longest_stay(current.state, start.provisioning_budget, start.idle_seconds)
            assert stayed <= longest + tick + 1e-6, (  # the pass clock adds floats
                f"{current.state} held {stayed:g} s",
                current,
            )
        world.apply(_decide(current, now), now)
        now += tick
    assert world.facts.state in GONE | UNBOUNDED, world.facts


def test_ssh_that_never_answers_ends_at_the_booting_limit() -> None:
    world = HangingWorld(_facts("requested", link_alive=True), hang_at=frozenset({"booting"}))
    now = 1.0
    while world.facts.state != "draining":
        world.apply(_decide(world.facts, now), now)
        assert world.facts.state in ("requested", "launching", "booting", "draining")
        now += 10.0
        assert now < 2 * LIMITS["booting"]  # type: ignore[operator]
    assert world.facts.step_in_flight  # the wait for SSH never returned
    assert now - 1.0 > LIMITS["booting"]  # type: ignore[operator]


@pytest.mark.slow  # hypothesis shrinks each counter-example it finds
@pytest.mark.parametrize("state", LIMITED)
def test_taking_any_state_limit_out_fails_the_property(
    state: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The property above is what holds each limit in place: without it, a step hanging in that
    state keeps the instance there for good."""
    monkeypatch.setitem(STATE_TIMEOUTS, state, None)
    with pytest.raises(AssertionError, match=f"{state} held"):
        test_no_state_outlasts_its_limit_whichever_steps_hang()


# --- examples --------------------------------------------------------------------------------


def _facts(state: str, **values: object) -> InstanceFacts:
    return replace(InstanceFacts(state=state, since=0.0), **values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("state", "limit", "to", "words"),
    [
        ("requested", STATE_TIMEOUTS["requested"], "never_launched", "the launch did not start"),
        ("launching", STATE_TIMEOUTS["launching"], "terminating", "the launch call"),
        ("booting", STATE_TIMEOUTS["booting"], "draining", "the wait for SSH"),
        ("bootstrapping", STATE_TIMEOUTS["bootstrapping"], "draining", "the bootstrap"),
        ("draining", STATE_TIMEOUTS["draining"], "terminating", "draining"),
    ],
)
def test_each_state_past_its_limit_moves_on_with_the_reason(
    state: str, limit: float, to: str, words: str
) -> None:
    # A step in flight does not hold the stuck pass back: a hung step is what leaves it stuck.
    facts = _facts(state, step_in_flight=True, teardown_in_flight=True)
    assert _decide(facts, limit) != [Move(to, f"{words} timed out after {limit:g} s")]
    (move,) = _decide(facts, limit + 1)
    assert move == Move(
        to,
        f"{words} timed out after {limit:g} s",
        failed_try=to != "never_launched" and state != "draining",
        announce=True,
    )


def test_a_job_budget_holds_a_provisioning_state_past_the_table() -> None:
    facts = _facts("launching", provisioning_budget=3_600.0, in_gang=True, launch_in_flight=True)
    assert _decide(facts, 1_000.0) == []
    (move,) = _decide(facts, 3_601.0)
    assert isinstance(move, Move) and move.to == "terminating"


def test_a_launch_queued_behind_others_is_not_stuck() -> None:
    facts = _facts("requested", launch_in_flight=True)
    assert _decide(facts, 10_000.0) == [Submit("launch")]


def test_a_job_ended_under_a_hung_bootstrap_drains_at_once() -> None:
    facts = _facts("bootstrapping", since=100.0, step_in_flight=True, job_ended=True)
    assert _decide(facts, 101.0) == [Move("draining", "its job ended while bootstrapping")]


def test_teardown_waits_only_for_its_own_step() -> None:
    assert _decide(_facts("draining", since=5.0, step_in_flight=True), 6.0) == [Submit("drain")]
    assert _decide(_facts("terminating", teardown_in_flight=True), 6.0) == []
    # A gang's launch call that never returns holds its nodes' terminate back no longer.
    hung = _facts("terminating", in_gang=True, launch_in_flight=True)
    assert _decide(hung, 6.0) == [Submit("terminate")]


def test_a_lost_link_reconnects_until_the_deadman_then_loses_the_worker() -> None:
    facts = _facts("in_use", worker_id="w-1", active_attempt=1)
    assert _decide(facts, 10.0) == [MarkUnreachable(10.0), Submit("reconnect")]
    later = replace(facts, unreachable_since=10.0)
    assert _decide(later, 10.0 + DEADMAN) == [Submit("reconnect")]
    assert _decide(later, 11.0 + DEADMAN) == [
        LoseWorker("worker_lost", "its instance could not be reached again")
    ]


def test_a_gang_is_handed_over_once_every_node_is_ready() -> None:
    node = _facts("ready", since=5.0, in_gang=True, link_alive=True, job_provisioning=True)
    assert _decide(replace(node, gang_all_ready=False), 6.0) == []
    assert _decide(node, 6.0) == [HandOver()]
    broken = replace(node, gang_broken="node 1 of its gang is draining", worker_id="w-1")
    assert _decide(broken, 6.0) == [
        EndGangNode("node 1 of its gang is draining", end_attempt=False)
    ]


def test_a_reclaimed_machine_is_remembered_before_it_is_released() -> None:
    facts = _facts("in_use", link_alive=True, worker_id="w-1", ended_by_reclaim=True)
    assert _decide(facts, 1.0) == [RememberReclaim(), Release("its job's attempt ended")]
    reclaimed = replace(facts, outcome="reclaimed", job_ended=True)
    assert _decide(reclaimed, 1.0) == [Release("its job ended")]


def test_a_running_job_is_checked_every_few_seconds() -> None:
    facts = _facts("in_use", link_alive=True, worker_id="w-1", active_attempt=2)
    assert _decide(facts, 100.0) == [Submit("check")]
    assert _decide(replace(facts, checked_at=98.0), 100.0) == []


# --- a held offer (the choice of what to launch) ----------------------------------------------


@dataclass
class HeldTry:
    """A try as the store keeps it: its offer and, for a reclaimed one, until when it is held."""

    job_id: str
    offer: dict[str, object]
    hold_until: float | None
    outcome: str | None = "reclaimed"
    outcome_scope: str | None = None
    outcome_message: str | None = "reclaimed by the provider"
    created_at: float = 0.0
    ended_at: float | None = 1.0


def _offer(index: int) -> Offer:
    return Offer(
        provider="aws",
        instance_type=f"type-{index}",
        region="r1",
        zone=f"z{index % 3}",
        cpu_cores=2,
        hourly_price=1.0 + index,
        spot=True,
    )


@given(
    holds=st.lists(st.none() | st.floats(0, 1_000), min_size=1, max_size=6),
    now=st.floats(0, 1_200),
)
def test_a_held_offer_is_never_chosen_before_its_time(
    holds: list[float | None], now: float
) -> None:
    offers = [_offer(i) for i in range(len(holds))]
    records = [
        HeldTry(f"j-{i}", offer.model_dump(), hold)
        for i, (offer, hold) in enumerate(zip(offers, holds, strict=True))
    ]
    decision = planning.choose(offers, [], now=now, held_offers=planning.held_offers(records, now))
    still_held = {
        planning.offer_key(o) for o, hold in zip(offers, holds, strict=True) if hold and hold > now
    }
    if decision.offer is not None:
        assert planning.offer_key(decision.offer) not in still_held
        # The cheapest offer not held is the one chosen.
        free = [o for o in offers if planning.offer_key(o) not in still_held]
        assert decision.offer == free[0]
    else:
        assert len(still_held) == len(offers) and decision.wait is not None


def test_only_cloud_jobs_without_a_machine_past_their_wait_are_planned() -> None:
    waiting = [("j-cloud", "cloud"), ("j-local", "local"), ("j-busy", "cloud"), ("j-wait", "cloud")]
    planned = jobs_to_plan(waiting, {"j-busy"}, {"j-wait": 105.0}, now=100.0)
    assert planned == ["j-cloud"]
    assert jobs_to_plan(waiting, {"j-busy"}, {"j-wait": 105.0}, now=105.0) == ["j-cloud", "j-wait"]


# --- warm machines (idle_seconds) ----------------------------------------------------------------


def _done_on(state: str, **values: object) -> InstanceFacts:
    """An instance whose job's attempt ran on its worker and ended."""
    base: dict[str, object] = {
        "link_alive": True,
        "worker_id": "w-1",
        "worker_ran_attempt": True,
        "idle_seconds": 30.0,
    }
    return _facts(state, **{**base, **values})


@pytest.mark.parametrize("state", ["ready", "in_use"])
def test_a_lone_healthy_machine_rests_when_its_provider_keeps_machines_warm(state: str) -> None:
    assert _decide(_done_on(state), 10.0) == [Rest("its job's attempt ended")]
    assert _decide(_done_on(state, job_ended=True), 10.0) == [Rest("its job ended")]
    # idle_seconds 0 is today's behaviour: it drains.
    assert _decide(_done_on(state, idle_seconds=0.0), 10.0) == [Release("its job's attempt ended")]


@pytest.mark.parametrize(
    "values",
    [
        {"outcome": "failed"},
        {"ended_by_reclaim": True},
        {"job_ended": True, "link_alive": False},  # a machine not reached is not kept
    ],
)
def test_a_machine_not_fit_to_keep_drains_even_with_idle_seconds(values: dict[str, object]) -> None:
    actions = _decide(_done_on("in_use", **values), 10.0)
    assert any(isinstance(a, Release) for a in actions), actions
    assert not any(isinstance(a, Rest) for a in actions), actions


def test_a_gang_node_rests_once_no_node_of_its_gang_runs_its_part() -> None:
    """A gang's machines go idle together: a node whose part is done waits while another
    node still runs its part, then rests as a lone machine does."""
    done = _done_on("in_use", in_gang=True, gang_still_runs=True)
    assert _decide(done, 10.0) == []
    assert _decide(replace(done, gang_still_runs=False), 10.0) == [Rest("its job's attempt ended")]


def test_an_idle_machine_waits_its_idle_seconds_then_drains() -> None:
    idle = _done_on("idle", job_ended=True, since=100.0)
    assert _decide(idle, 130.0) == []
    assert _decide(idle, 130.5) == [Move("draining", "idle for 30 s: no job took it")]


def test_an_idle_machine_keeps_its_link_or_loses_its_worker_at_the_deadman() -> None:
    idle = _done_on("idle", job_ended=True, idle_seconds=5_000.0, link_alive=False)
    assert _decide(idle, 10.0) == [MarkUnreachable(10.0), Submit("reconnect")]
    (lose,) = _decide(replace(idle, unreachable_since=10.0), 10.0 + DEADMAN + 1)
    assert isinstance(lose, LoseWorker) and lose.reason == "worker_lost"
