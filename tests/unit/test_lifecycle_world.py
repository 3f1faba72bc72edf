"""The pass's one decision over the whole world (every live instance, the jobs waiting for a
machine, what each instance's last step left in the store), driven without any I/O: a model of
the steps carries each pass's result out, with steps that hang for good at any chosen state
(SSH that never answers included) or fail and back off, and the loop sleeps as the decision
says. Properties: no state outlasts its limit whatever hangs, sleeping until the earliest
follow-up never misses a change, and taking any state's limit out breaks the first."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulayer.cloud.lifecycle.decide import (
    EndGangNode,
    HandOver,
    InstanceFacts,
    LoseWorker,
    MarkReachable,
    MarkUnreachable,
    Move,
    Release,
    Rest,
    Submit,
    decide,
)
from gpulayer.cloud.lifecycle.results import error_of, prepare_failed
from gpulayer.cloud.lifecycle.states import (
    GONE,
    PROVISIONING_STATES,
    STATE_TIMEOUTS,
    STATES,
    TRANSITIONS,
)
from gpulayer.cloud.lifecycle.step_result import StepResult, failed
from gpulayer.cloud.lifecycle.world import Live, PassDecision, World, decide_pass, next_change

DEADMAN = 600.0
LIVE = [s for s in STATES if s not in GONE]
LIMITS = dict(STATE_TIMEOUTS)
"""The limits as documented, kept before any test takes one out of the live table."""
LIMITED = [state for state, limit in LIMITS.items() if limit is not None]
UNBOUNDED = {state for state in LIVE if LIMITS[state] is None}
USUAL_WAKE = 1.0


@dataclass
class Node:
    """One instance of the model: its facts, the step it hangs in, if any."""

    request_id: str
    job_id: str
    facts: InstanceFacts
    result: StepResult | None = None
    """What its last step left in the store."""


class Model:
    """The steps as the reconciler's executors do them: a step begun in a state of
    ``hang_at`` never returns (requested: the launch never starts; launching: the provider
    never answers; booting: SSH never answers; bootstrapping: the install never ends; ready:
    the hand-over never dispatches; in_use: the check hangs; draining, terminating: the
    teardown call never returns); in a state of ``fail_at`` it fails, and its result (stored
    with the instance) says what follows: a machine not made a worker drains, a tunnel not
    reopened is tried again after its not_before."""

    def __init__(self, nodes: list[Node], hang_at: frozenset[str], fail_at: frozenset[str]):
        self.nodes = {n.request_id: n for n in nodes}
        self.hang_at = hang_at
        self.fail_at = fail_at

    def world(self, waiting: list[tuple[str, str]], waits: dict[str, float]) -> World:
        live = [
            Live(n.request_id, n.job_id, n.facts)
            for n in self.nodes.values()
            if n.facts.state not in GONE
        ]
        return World(live, waiting, waits, {}, DEADMAN)

    def carry_out(self, decision: PassDecision, now: float) -> None:
        for request_id, actions in decision.instances.items():
            node = self.nodes[request_id]
            for action in actions:
                self._apply(node, action, now)

    def _move(self, node: Node, to: str, now: float) -> None:
        assert to in TRANSITIONS[node.facts.state], (node.facts.state, to)
        node.facts = replace(node.facts, state=to, since=now)

    def _apply(self, node: Node, action: object, now: float) -> None:
        if isinstance(action, Move):
            self._move(node, action.to, now)
        elif isinstance(action, (Release, LoseWorker, EndGangNode)):
            self._move(node, "draining", now)
        elif isinstance(action, Rest):
            self._move(node, "idle", now)
        elif isinstance(action, MarkUnreachable):
            node.facts = replace(node.facts, unreachable_since=action.at)
        elif isinstance(action, MarkReachable):
            node.facts = replace(node.facts, unreachable_since=None)
        elif isinstance(action, HandOver) and node.facts.state not in self.hang_at:
            node.facts = replace(node.facts, active_attempt=1, worker_id="w-1")
        elif isinstance(action, Submit):
            self._step(node, action.step, now)

    def _step(self, node: Node, step: str, now: float) -> None:
        state = node.facts.state
        if node.facts.launch_in_flight and step == "launch":
            return  # its launch call is still under way
        if state in self.hang_at:
            if step == "launch" and state == "requested":
                return  # the launch never starts: no lease is ever taken
            if step == "launch":
                node.facts = replace(node.facts, launch_in_flight=True)
            elif step in ("drain", "terminate"):
                node.facts = replace(node.facts, teardown_in_flight=True)
            else:
                node.facts = replace(node.facts, step_in_flight=True)
            return
        if state in self.fail_at:
            self._fail(node, step, now)
            return
        self._finish(node, step, now)

    def _fail(self, node: Node, step: str, now: float) -> None:
        if step == "prepare":
            error = error_of(TimeoutError("SSH did not answer"))
            reading = prepare_failed(error, in_gang=False, node_rank=0, label="box", place="z1")
            assert reading.end.outcome == "failed"
            self._move(node, "draining", now)
            node.result = failed("prepare", now, error, move_to="draining")
        elif step in ("reconnect", "terminate"):
            node.result = failed(step, now, error_of(OSError("refused")), not_before=now + 5)  # type: ignore[arg-type]
            node.facts = replace(node.facts, next_step_at=node.result.not_before)
        else:
            self._finish(node, step, now)

    def _finish(self, node: Node, step: str, now: float) -> None:
        state = node.facts.state
        if step == "launch":
            if state == "requested":
                self._move(node, "launching", now)
            if "launching" in self.hang_at:  # the provider's call never answers
                node.facts = replace(node.facts, launch_in_flight=True)
                return
            self._move(node, "booting", now)
        elif step == "prepare":
            if state == "booting":
                self._move(node, "bootstrapping", now)
            if "bootstrapping" in self.hang_at:  # SSH answered; the install never ends
                node.facts = replace(node.facts, step_in_flight=True)
                return
            self._move(node, "ready", now)
            node.facts = replace(node.facts, link_alive=True)
        elif step == "reconnect":
            node.facts = replace(node.facts, link_alive=True)
        elif step == "drain":
            self._move(node, "terminating", now)
        elif step == "terminate":
            self._move(node, "terminated", now)


def _start(state: str, index: int, budget: float, idle: float = 0.0) -> Node:
    facts = InstanceFacts(
        state=state,
        since=0.0,
        link_alive=True,
        provisioning_budget=budget,
        job_provisioning=True,
        idle_seconds=idle,
    )
    return Node(f"r-{index}", f"j-{index}", facts)


def _passes(budget: float, idle: float) -> float:
    longest = max(limit for s, limit in LIMITS.items() if limit is not None and s != "idle")
    return 2 * longest + budget + idle + 1_000


def _drive(model: Model, tick_cap: float, budget: float, idle: float = 0.0) -> None:
    """Passes as the loop runs them: each sleeps as the decision says (no longer than the
    usual wake-up, here stretched to ``tick_cap`` to keep the run short), and every node's
    stay in a limited state is checked against its limit at each pass."""
    now, end = 1.0, _passes(budget, idle)
    while now < end:
        for node in model.nodes.values():
            state = node.facts.state
            limit = LIMITS.get(state)
            if limit is not None and state not in GONE:
                longest = max(limit, budget) if state in PROVISIONING_STATES else limit
                if state == "idle":  # its provider's idle_seconds, within the table's limit
                    longest = min(limit, node.facts.idle_seconds)
                stayed = now - node.facts.since
                assert stayed <= longest + tick_cap + 1e-6, (f"{state} held {stayed:g} s", node)
        decision = decide_pass(model.world([], {}), now)
        model.carry_out(decision, now)
        now += min(tick_cap, max(decision.sleep_for(now, tick_cap), 1.0))
        if all(n.facts.state in GONE for n in model.nodes.values()):
            return


world_states = st.lists(st.sampled_from(LIVE), min_size=1, max_size=5)


@settings(max_examples=200, deadline=None)
@given(
    states=world_states,
    hang_at=st.frozensets(st.sampled_from(LIVE)),
    fail_at=st.frozensets(st.sampled_from(LIVE)),
    budget=st.floats(0, 1_000),
    tick=st.floats(5, 400),
    idle=st.just(0.0) | st.floats(1, 1_000),
)
def test_no_state_outlasts_its_limit_in_a_world_whichever_steps_hang(
    states: list[str],
    hang_at: frozenset[str],
    fail_at: frozenset[str],
    budget: float,
    tick: float,
    idle: float,
) -> None:
    """Many instances at once, each in any live state, and the steps begun in any chosen states
    hang for good (SSH never answering among them) or fail: the one decision per pass holds no
    instance in a state past that state's limit (a provisioning state: or the job's budget)
    and one pass, and each ends gone or where only its job or the reaper moves it on."""
    model = Model(
        [_start(state, i, budget, idle) for i, state in enumerate(states)],
        hang_at,
        fail_at - hang_at,
    )
    _drive(model, tick, budget, idle)
    for node in model.nodes.values():
        assert node.facts.state in GONE | UNBOUNDED, node


def test_ssh_that_never_answers_ends_at_the_booting_limit_in_a_world() -> None:
    """One instance whose SSH never answers beside one that comes up: the first drains at the
    booting limit, the other is handed its job meanwhile."""
    model = Model(
        [_start("requested", 0, 0.0), _start("booting", 1, 0.0)],
        hang_at=frozenset({"booting"}),
        fail_at=frozenset(),
    )
    model.nodes["r-1"].facts = replace(model.nodes["r-1"].facts, since=0.0)
    stuck = model.nodes["r-0"]
    now = 1.0
    while stuck.facts.state != "draining":
        model.carry_out(decide_pass(model.world([], {}), now), now)
        now += 10.0
        assert now < 2 * LIMITS["booting"]  # type: ignore[operator]
    assert now - 1.0 > LIMITS["booting"]  # type: ignore[operator]
    assert model.nodes["r-1"].facts.state in ("booting", "draining", "terminating", "terminated")


@pytest.mark.slow  # hypothesis shrinks each counter-example it finds
@pytest.mark.parametrize("state", LIMITED)
def test_taking_any_state_limit_out_fails_the_world_property(
    state: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(STATE_TIMEOUTS, state, None)
    with pytest.raises(AssertionError, match=f"{state} held"):
        test_no_state_outlasts_its_limit_in_a_world_whichever_steps_hang()


# --- follow-ups: the loop's sleep -------------------------------------------------------------

facts_strategy = st.builds(
    InstanceFacts,
    state=st.sampled_from(STATES),
    since=st.floats(0, 10_000),
    node_rank=st.integers(0, 1),
    in_gang=st.booleans(),
    unreachable_since=st.none() | st.floats(0, 10_000),
    next_step_at=st.none() | st.floats(0, 20_000),
    job_ended=st.booleans(),
    job_provisioning=st.booleans(),
    gang_all_ready=st.booleans(),
    launch_in_flight=st.booleans(),
    step_in_flight=st.booleans(),
    teardown_in_flight=st.booleans(),
    provisioning_budget=st.floats(0, 5_000),
    link_alive=st.booleans(),
    worker_id=st.none() | st.just("w-1"),
    active_attempt=st.none() | st.integers(1, 3),
    worker_ran_attempt=st.booleans(),
    checked_at=st.floats(0, 20_000),
    # An idle machine has idle_seconds > 0 (one of 0 never rests; set to 0 meanwhile, it drains).
    idle_seconds=st.floats(1, 2_000),
)


@settings(max_examples=500, deadline=None)
@given(facts=facts_strategy, now=st.floats(0, 20_000), later=st.floats(0, 1))
def test_an_instance_that_waits_changes_no_sooner_than_its_follow_up(
    facts: InstanceFacts, now: float, later: float
) -> None:
    """Sleeping until the follow-up misses nothing: an instance decided to wait is decided to
    wait at any time before its follow-up's not_before (with no news)."""
    if decide(facts, now, deadman_seconds=DEADMAN):
        return
    due = next_change(facts, now, {}, DEADMAN)
    horizon = due[0] if due is not None else now + 50_000
    assert horizon > now
    sometime = now + later * (horizon - now) * 0.999
    assert list(decide(facts, sometime, deadman_seconds=DEADMAN)) == [], (due, sometime)


@settings(max_examples=300, deadline=None)
@given(
    jobs=st.lists(
        st.tuples(
            st.sampled_from(["cloud", "remote"]), st.booleans(), st.none() | st.floats(0, 200)
        ),
        max_size=6,
    ),
    now=st.floats(0, 200),
)
def test_a_pass_plans_each_free_cloud_job_once_its_wait_ends_and_follows_the_others_up(
    jobs: list[tuple[str, bool, float | None]], now: float
) -> None:
    waiting = [(f"j-{i}", target) for i, (target, _, _) in enumerate(jobs)]
    busy = [
        Live(f"r-{i}", f"j-{i}", InstanceFacts("in_use", 0.0, link_alive=True, checked_at=now))
        for i, (_, has_instance, _) in enumerate(jobs)
        if has_instance
    ]
    waits = {f"j-{i}": w for i, (_, _, w) in enumerate(jobs) if w is not None}
    waits["j-gone"] = 1.0  # a job that no longer waits
    decision = decide_pass(World(busy, waiting, waits, {}, DEADMAN), now)
    free = [f"j-{i}" for i, (target, has, _) in enumerate(jobs) if target == "cloud" and not has]
    assert list(decision.plan) == [j for j in free if waits.get(j, 0.0) <= now]
    followed = {f.key for f in decision.follow_ups if f.key.startswith("j-")}
    assert followed == {j for j in free if waits.get(j, 0.0) > now}
    assert decision.ended_waits == {"j-gone"}
    if decision.follow_ups:
        earliest = min(f.not_before for f in decision.follow_ups)
        assert decision.sleep_for(now, USUAL_WAKE) <= max(earliest - now, 0.05)
    assert decision.sleep_for(now, USUAL_WAKE) <= USUAL_WAKE


def test_a_step_result_round_trips_through_its_stored_form() -> None:
    result = failed("reconnect", 10.0, error_of(OSError("refused")), not_before=15.0)
    again = StepResult.from_json(result.to_json())
    assert again == result
    assert result.columns()["next_step_at"] == 15.0 and result.columns()["last_step"] == "reconnect"
    assert StepResult.from_json('{"step": "launch", "shape": "newer"}') is None
    assert StepResult.from_json(None) is None


def test_a_job_whose_only_machine_is_idle_is_planned_and_the_idle_limit_is_followed_up() -> None:
    """A job queued again (a retry) while its last machine is idle is planned (it may take the
    machine back); a job whose machine runs it is not; the idle machine's follow-up is the end
    of its idle_seconds."""
    idle = InstanceFacts(
        state="idle", since=0.0, idle_seconds=60.0, link_alive=True, job_ended=True
    )
    running = InstanceFacts(
        state="in_use", since=0.0, link_alive=True, active_attempt=1, checked_at=0.9
    )
    world = World(
        [Live("r-1", "j-1", idle), Live("r-2", "j-2", running)],
        [
            ("j-1", "cloud"),
            ("j-2", "cloud"),
        ],
    )
    decision = decide_pass(world, 1.0)
    assert decision.plan == ("j-1",)
    assert not decision.instances.get("r-1")
    (follow_up,) = [f for f in decision.follow_ups if f.key == "r-1"]
    assert follow_up.not_before == 60.0
