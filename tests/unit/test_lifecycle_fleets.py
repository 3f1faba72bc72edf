"""Named fleets in the pass's one decision, without I/O: a fleet below its min_nodes is topped
up (a decision of decide_pass, backed off while its last top-up found nothing), never beyond
max_nodes; its machines that no job took are made workers and wait idle; idle ones within
min_nodes are kept with no idle limit, those above it end after the fleet's idle_seconds; a
fleet taken out of the configuration ends its machines once no job uses them. A model world
drives the passes with steps that hang or fail in any state (as test_lifecycle_world's)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpulayer.cloud.fleets import FleetRule, fleet_problems
from gpulayer.cloud.lifecycle.decide import InstanceFacts, Release, Rest, Submit
from gpulayer.cloud.lifecycle.states import GONE, STATE_TIMEOUTS
from gpulayer.cloud.lifecycle.world import (
    Live,
    PassDecision,
    World,
    decide_pass,
    fleet_wait_key,
)
from tests.unit.test_lifecycle_world import LIVE, Model, Node

DEADMAN = 600.0


def machine(
    rid: str, state: str, *, since: float = 0.0, fleet: str = "train", **kw: object
) -> Live:
    values: dict[str, object] = {"link_alive": True, **kw}
    facts = InstanceFacts(state=state, since=since, fleet=fleet, **values)  # type: ignore[arg-type]
    return Live(rid, "" if facts.no_job else f"j-{rid}", facts)


def world(
    *lives: Live, rules: tuple[FleetRule, ...], waits: dict[str, float] | None = None
) -> World:
    return World(list(lives), (), waits or {}, {}, DEADMAN, fleets=rules)


TRAIN = FleetRule("train", min_nodes=2, max_nodes=3, idle_seconds=60.0)


def test_a_fleet_below_its_min_nodes_is_topped_up_without_any_job() -> None:
    decision = decide_pass(world(rules=(TRAIN,)), now=10.0)
    assert decision.top_ups == (("train", 2),)
    one = machine("r-1", "booting", no_job=True)
    assert decide_pass(world(one, rules=(TRAIN,)), now=10.0).top_ups == (("train", 1),)


def test_machines_being_torn_down_do_not_count_and_a_full_fleet_is_not_topped_up() -> None:
    up = [machine(f"r-{i}", "idle", no_job=True, job_ended=True) for i in range(2)]
    assert decide_pass(world(*up, rules=(TRAIN,)), now=10.0).top_ups == ()
    ending = machine("r-9", "draining", no_job=True)
    assert decide_pass(world(up[0], ending, rules=(TRAIN,)), now=10.0).top_ups == (("train", 1),)


def test_a_top_up_that_found_nothing_waits_its_backoff_and_is_followed_up() -> None:
    key = fleet_wait_key("train")
    decision = decide_pass(world(rules=(TRAIN,), waits={key: 50.0}), now=10.0)
    assert decision.top_ups == ()
    assert [(f.key, f.not_before) for f in decision.follow_ups] == [(key, 50.0)]
    assert key not in decision.ended_waits  # a fleet's wait is not a job's that ended
    later = decide_pass(world(rules=(TRAIN,), waits={key: 50.0}), now=51.0)
    assert later.top_ups == (("train", 2),)


def test_a_machine_made_a_worker_for_a_fleet_rests_idle() -> None:
    ready = machine("r-1", "ready", no_job=True, worker_id="w-1")
    (action,) = decide_pass(world(ready, rules=(TRAIN,)), now=5.0).instances["r-1"]
    assert isinstance(action, Rest) and "fleet train" in action.why


def test_idle_machines_within_min_nodes_are_kept_and_those_above_end_after_idle_seconds() -> None:
    busy = machine("r-1", "in_use", active_attempt=1, worker_id="w-1", checked_at=1e9)
    oldest = machine("r-2", "idle", since=0.0, job_ended=True)
    newest = machine("r-3", "idle", since=100.0, job_ended=True)
    decision = decide_pass(world(busy, oldest, newest, rules=(TRAIN,)), now=10_000.0)
    # min_nodes 2: the busy one and the longest idle are within it; the newest is above.
    assert "r-2" not in decision.instances
    (move,) = decision.instances["r-3"]
    assert move.to == "draining" and "idle for 60 s" in move.reason  # type: ignore[union-attr]
    # A kept machine has no idle limit to follow up.
    assert all(f.key != "r-2" for f in decision.follow_ups)


def test_a_fleet_taken_out_of_the_configuration_ends_its_machines_once_no_job_uses_them() -> None:
    idle = machine("r-1", "idle", job_ended=True)
    booting = machine("r-2", "booting", no_job=True)
    running = machine("r-3", "in_use", active_attempt=1, worker_id="w-1", checked_at=1e9)
    decision = decide_pass(world(idle, booting, running, rules=()), now=5.0)
    assert isinstance(decision.instances["r-1"][0], Release)
    assert decision.instances["r-2"][0].to == "draining"  # type: ignore[union-attr]
    assert "r-3" not in decision.instances  # its job runs on; it ends after it
    ended = replace(running.facts, job_ended=True)
    after = decide_pass(world(Live("r-3", "j-3", ended), rules=()), now=6.0)
    assert isinstance(after.instances["r-3"][0], Release)


def test_fleets_validate_into_one_line_per_problem_naming_the_field() -> None:
    _, problems = fleet_problems(
        [
            {"name": "train", "min_nodes": 3, "max_nodes": 2, "providers": ["gcp"]},
            {"name": "train"},
            {"name": "infer", "min_nodes": "1", "idle_secs": 5},
            "bare",
            {"name": "Train Fleet"},
        ],
        ["ssh", "aws"],
    )
    assert problems == [
        "fleets[train].min_nodes: must be <= max_nodes (2)",
        "fleets[train].providers: 'gcp' is not a provider section of this file (listed: aws, ssh)",
        "fleets[train].name: another fleet has this name",
        "fleets[infer].min_nodes: '1' (a string) is not an integer",
        "fleets[infer].idle_secs: unknown setting; did you mean 'idle_seconds'?",
        "fleets[3]: must be a mapping of settings, not 'bare'",
        "fleets[Train Fleet].name: 'Train Fleet': lowercase letters, digits and dashes, "
        "at most 26, starting with a letter or digit",
    ]


class FleetModel(Model):
    """The model world of test_lifecycle_world, with fleets: a top-up adds its machines (no
    job, requested) as the fleet step records them."""

    def __init__(
        self, rules: tuple[FleetRule, ...], hang_at: frozenset[str], fail_at: frozenset[str]
    ):
        super().__init__([], hang_at, fail_at)
        self.rules = rules
        self.made = 0

    def fleet_world(self) -> World:
        live = [
            Live(n.request_id, n.job_id, n.facts)
            for n in self.nodes.values()
            if n.facts.state not in GONE
        ]
        return World(live, (), {}, {}, DEADMAN, fleets=self.rules)

    def carry_out(self, decision: PassDecision, now: float) -> None:
        super().carry_out(decision, now)
        for fleet, count in decision.top_ups:
            for _ in range(count):
                self.made += 1
                facts = InstanceFacts(state="requested", since=now, fleet=fleet, no_job=True)
                node = Node(f"f-{self.made}", "", facts)
                self.nodes[node.request_id] = node
                self._step(node, "launch", now)  # the fleet step starts its launch at once


@settings(max_examples=150, deadline=None)
@given(
    min_nodes=st.integers(0, 3),
    extra=st.integers(0, 2),
    idle=st.floats(0, 500),
    hang_at=st.frozensets(st.sampled_from(LIVE)),
    fail_at=st.frozensets(st.sampled_from(LIVE)),
    tick=st.floats(1, 100),
)
def test_a_fleet_never_holds_more_than_max_nodes_and_kept_machines_stay_whatever_hangs(
    min_nodes: int,
    extra: int,
    idle: float,
    hang_at: frozenset[str],
    fail_at: frozenset[str],
    tick: float,
) -> None:
    rule = FleetRule("train", min_nodes, max(1, min_nodes) + extra, idle)
    model = FleetModel((rule,), hang_at, fail_at - hang_at)
    now = 1.0
    for _ in range(400):
        decision = decide_pass(model.fleet_world(), now)
        model.carry_out(decision, now)
        counted = [
            n
            for n in model.nodes.values()
            if n.facts.state not in GONE | {"draining", "terminating"}
        ]
        assert len(counted) <= rule.max_nodes
        for node in model.nodes.values():
            limit = STATE_TIMEOUTS.get(node.facts.state)
            if node.facts.state != "idle" and limit is not None and node.facts.state in LIVE:
                assert now - node.facts.since <= max(limit, 0) + tick + 1e-6, node
        now += tick
    if not hang_at and not fail_at:
        # Nothing hangs or fails: the fleet holds min_nodes idle machines, kept.
        idle_nodes = [n for n in model.nodes.values() if n.facts.state == "idle"]
        assert len(idle_nodes) == min_nodes
        assert model.made == min_nodes
    assert all(
        not isinstance(a, Submit) or a.step != "launch" or model.nodes[rid].facts.fleet
        for rid, actions in decide_pass(model.fleet_world(), now).instances.items()
        for a in actions
    )


def test_a_kept_fleet_machine_still_falls_to_the_dead_man_switch() -> None:
    """Kept within min_nodes means no idle limit, not no safety: a worker that cannot be
    reached is lost after deadman_seconds as any idle machine's."""
    lost = machine("r-1", "idle", job_ended=True, link_alive=False, unreachable_since=0.0)
    decision = decide_pass(world(lost, rules=(TRAIN,)), now=DEADMAN + 1)
    assert any(type(a).__name__ == "LoseWorker" for a in decision.instances["r-1"])
