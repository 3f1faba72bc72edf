"""The cloud lifecycle's pure parts: the instance state table, the choice of the next offer
(capacity waits, refusals, held offers) and a job's phases from its transitions."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpulayer.cloud.lifecycle import planning
from gpulayer.cloud.lifecycle.phases import phases
from gpulayer.cloud.lifecycle.states import (
    GONE,
    STATE_TIMEOUTS,
    STATES,
    STUCK_STATES,
    TRANSITIONS,
    TransitionError,
    check_transition,
    stuck_move,
    timed_out,
)
from gpulayer.cloud.offer import Offer


def offer(name: str, price: float, zone: str = "z1") -> Offer:
    return Offer(
        provider="ssh", instance_type=name, region="lab", zone=zone, cpu_cores=2, hourly_price=price
    )


@dataclass
class Try:
    """An instance record as the choice reads it."""

    offer: dict[str, object] | None
    outcome: str | None = None
    outcome_scope: str | None = None
    outcome_message: str | None = None
    hold_until: float | None = None
    created_at: float = 100.0
    ended_at: float | None = 100.0
    job_id: str = "j-1"
    last_error: str | None = None


def record(o: Offer | None, end: planning.TryEnd | None, **values: object) -> Try:
    columns = end.columns() if end is not None else {}
    columns.pop("note", None)
    data = o.model_dump(mode="json") if o is not None else None
    return Try(data, **columns, **values)  # type: ignore[arg-type]


def past(
    o: Offer, end: planning.TryEnd | None, at: float = 100.0, ended: float | None = 100.0
) -> planning.PastTry:
    found = planning.past_try(record(o, end, created_at=at, ended_at=ended))
    assert found is not None
    return found


# --- the state table ---------------------------------------------------------------------


def test_every_state_has_its_moves_and_a_timeout_entry() -> None:
    assert set(TRANSITIONS) == set(STATES) == set(STATE_TIMEOUTS)
    for state, targets in TRANSITIONS.items():
        assert targets <= set(STATES), state


def test_gone_states_are_final_and_every_live_state_can_reach_one() -> None:
    for state in GONE:
        assert TRANSITIONS[state] == frozenset()
    for state in set(STATES) - GONE:
        seen, todo = set(), [state]
        while todo:
            current = todo.pop()
            seen.add(current)
            todo += [t for t in TRANSITIONS[current] if t not in seen]
        assert seen & GONE, f"{state} can never be torn down"


def test_a_move_the_table_does_not_allow_is_refused_naming_what_is() -> None:
    check_transition("requested", "launching")
    check_transition("bootstrapping", "booting")  # a restart starts the bootstrap over
    with pytest.raises(TransitionError, match="from in_use to requested"):
        check_transition("in_use", "requested")
    with pytest.raises(TransitionError, match="none \\(final\\)"):
        check_transition("terminated", "terminating")
    with pytest.raises(TransitionError, match="unknown instance state"):
        check_transition("flying", "terminated")


def test_running_jobs_and_retried_terminates_have_no_timeout() -> None:
    assert not timed_out("in_use", 0, 10**9)
    assert not timed_out("terminating", 0, 10**9)
    assert timed_out("draining", 0, STATE_TIMEOUTS["draining"] + 1)  # type: ignore[operator]
    assert not timed_out("draining", 0, 1)


# --- choosing the next offer -------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "to", "reason", "failed_try"),
    [
        ("requested", "never_launched", "the launch did not start timed out after 60 s", False),
        ("launching", "terminating", "the launch call timed out after 900 s", True),
        ("booting", "draining", "the wait for SSH timed out after 900 s", True),
        ("bootstrapping", "draining", "the bootstrap timed out after 900 s", True),
        ("draining", "terminating", "draining timed out after 120 s", False),
    ],
)
def test_each_state_with_a_limit_is_moved_on_once_it_is_outstayed(
    state: str, to: str, reason: str, failed_try: bool
) -> None:
    limit = STATE_TIMEOUTS[state]
    assert limit is not None
    assert stuck_move(state, since=1000.0, now=1000.0 + limit) is None
    move = stuck_move(state, since=1000.0, now=1000.0 + limit + 1)
    assert move is not None and (move.to, move.reason, move.failed_try) == (to, reason, failed_try)


def test_configured_limits_replace_the_table_and_unlimited_states_are_never_stuck() -> None:
    move = stuck_move("bootstrapping", 0.0, 301.0, {"bootstrapping": 300.0})
    assert move is not None and move.reason == "the bootstrap timed out after 300 s"
    assert stuck_move("bootstrapping", 0.0, 299.0, {"bootstrapping": 300.0}) is None
    for state in ("in_use", "terminating", "terminated", "never_launched", "ready"):
        assert stuck_move(state, 0.0, 10.0**9) is None
    assert {s for s, limit in STATE_TIMEOUTS.items() if limit} - {"ready"} == STUCK_STATES


def test_the_cheapest_untried_offer_comes_first() -> None:
    cheap, dear = offer("cheap", 0.1), offer("dear", 0.9)
    assert planning.choose([cheap, dear], [], now=0).offer == cheap


def test_a_failed_offer_is_not_tried_again_and_then_the_job_gives_up() -> None:
    cheap, dear = offer("cheap", 0.1), offer("dear", 0.9)
    tries = [past(cheap, planning.failed("no python"))]
    assert planning.choose([cheap, dear], tries, now=200).offer == dear
    tries.append(past(dear, planning.failed("bootstrap timed out")))
    decision = planning.choose([cheap, dear], tries, now=200)
    assert decision.offer is None and decision.wait is None
    assert decision.give_up == (
        "every offer failed: ssh/z1/cheap: no python; ssh/z1/dear: bootstrap timed out"
    )


def test_a_capacity_refusal_blocks_its_zone_for_a_backoff_then_frees_it() -> None:
    a, b = offer("a", 0.1, "z1"), offer("b", 0.2, "z1")
    tries = [past(a, planning.refused("capacity", "zone", "no room"), at=100, ended=100)]
    waiting = planning.choose([a, b], tries, now=101)
    assert waiting.offer is None  # the whole zone is out of capacity
    assert (
        waiting.wait
        == "waiting for capacity: 1 offer(s) busy or out of capacity (ssh/z1/a: no room)"
    )
    assert waiting.retry_in == planning.backoff_seconds(1)
    assert planning.choose([a, b], tries, now=101 + planning.backoff_seconds(1)).offer == a
    assert planning.choose([a, b], tries, now=102, capacity_freed_at=101).offer == a


def test_backoff_doubles_up_to_a_minute() -> None:
    assert [planning.backoff_seconds(n) for n in (1, 2, 3, 4, 5, 9)] == [5, 10, 20, 40, 60, 60]


def test_with_on_unschedulable_fail_capacity_ends_the_job_at_once() -> None:
    a = offer("a", 0.1)
    tries = [past(a, planning.refused("capacity", "zone", "no room"))]
    decision = planning.choose([a], tries, now=101, queue=False)
    assert decision.give_up is not None and decision.give_up.startswith("no capacity: 1 offer(s)")


def test_the_wait_for_capacity_ends_at_the_provisioning_timeout() -> None:
    busy = ["ssh/z1/a: in use by job j-1", "ssh/z2/b: in use by job j-2"]
    waiting = planning.choose([], [], now=150, busy=busy, wait_limit=60, wait_started=100)
    assert waiting.wait is not None and waiting.wait.startswith(
        "waiting for capacity: 2 offer(s) busy"
    )
    assert "in use by job j-1" in waiting.wait
    late = planning.choose([], [], now=161, busy=busy, wait_limit=60, wait_started=100)
    assert late.give_up is not None
    assert late.give_up.startswith("no capacity within provisioning_timeout_seconds (60 s)")


def test_a_job_that_does_not_queue_waits_for_machines_idle_or_being_torn_down() -> None:
    """The 2-node break: a gang submitted right after another, whose hosts are still being torn
    down, waits for them (they free within a teardown) rather than failing unschedulable; a
    machine another job runs on still ends it at once."""
    ending = ["ssh/lab/h0: in use by job j-1 (being torn down)", "ssh/lab/h1: idle, kept warm"]
    waits = planning.choose([], [], now=10, busy=ending, freeing=ending, queue=False)
    assert waits.wait is not None and "being torn down" in waits.wait
    running = ["ssh/lab/h0: in use by job j-1"]
    fails = planning.choose([], [], now=10, busy=running, queue=False)
    assert fails.give_up is not None and fails.give_up.startswith("no capacity: 1 offer(s)")
    # The provisioning timeout still bounds that wait.
    late = planning.choose(
        [], [], now=200, busy=ending, freeing=ending, queue=False, wait_limit=60, wait_started=1
    )
    assert late.give_up is not None


def test_credentials_refused_block_the_whole_provider_and_give_up() -> None:
    a, b = offer("a", 0.1, "z1"), offer("b", 0.2, "z2")
    tries = [past(a, planning.refused("auth", "provider", "credentials rejected"))]
    decision = planning.choose([a, b], tries, now=10**6)
    assert decision.offer is None and decision.wait is None
    assert decision.give_up == "every offer failed: ssh/z1/a: credentials rejected"


def test_a_held_offer_is_skipped_and_waited_for_when_it_is_the_only_one() -> None:
    a, b = offer("a", 0.1), offer("b", 0.2, "z2")
    held = {planning.offer_key(a): "reclaimed from job j-1"}
    assert planning.choose([a, b], [], now=0, held_offers=held).offer == b
    only = planning.choose([a], [], now=0, held_offers=held)
    assert only.wait is not None and "ssh/z1/a: reclaimed from job j-1" in only.wait


def test_records_without_an_offer_or_an_outcome_are_not_refusals() -> None:
    assert planning.past_try(record(None, planning.refused("capacity", "zone", "x"))) is None
    ran = past(offer("a", 0.1), None)
    assert ran.outcome == "other"
    assert planning.choose([offer("a", 0.1)], [ran], now=0).offer is not None


def test_a_failed_try_whose_terminate_then_failed_still_blocks_its_offer() -> None:
    # The terminate's error lives in its own column; the try's outcome is untouched by it.
    a, b = offer("a", 0.1), offer("b", 0.2)
    tried = record(a, planning.failed("no SSH"), last_error="terminate failed: timeout")
    tries = planning.tries_of([tried])
    assert [t.outcome for t in tries] == ["failed"]
    assert planning.choose([a, b], tries, now=200).offer == b


def test_a_reclaimed_offer_is_held_for_every_job_until_its_time() -> None:
    a, b = offer("a", 0.1), offer("b", 0.2)
    reclaimed = record(
        a, planning.TryEnd("reclaimed", None, "reclaimed by the provider"), hold_until=700.0
    )
    held = planning.held_offers([reclaimed], now=600.0)
    assert held == {planning.offer_key(a): "reclaimed from job j-1"}
    assert planning.choose([a, b], [], now=600.0, held_offers=held).offer == b
    assert planning.held_offers([reclaimed], now=700.0) == {}
    # The reclaim itself is no refusal: once the hold ends the offer is chosen again.
    tries = planning.tries_of([reclaimed])
    assert planning.choose([a, b], tries, now=701.0).offer == a


def test_a_try_end_reads_as_a_note_and_as_columns() -> None:
    end = planning.refused("capacity", "zone", "no room")
    assert end.note == "capacity/zone: no room"
    assert end.columns() == {
        "outcome": "capacity",
        "outcome_scope": "zone",
        "outcome_message": "no room",
        "note": "capacity/zone: no room",
    }
    assert planning.failed("boom").note == "failed: boom"
    with pytest.raises(ValueError):
        planning.refused("failed", "zone", "x")


# --- phases ----------------------------------------------------------------------------------


@dataclass
class Step:
    to_state: str
    at: float


def test_phases_fold_states_and_show_a_restarted_bootstrap_as_a_second_ssh_wait() -> None:
    history = [
        Step("requested", 0),
        Step("launching", 1),
        Step("booting", 3),
        Step("bootstrapping", 4),
        Step("booting", 6),  # the controller restarted mid-bootstrap
        Step("bootstrapping", 7),
        Step("ready", 10),
        Step("in_use", 11),
        Step("draining", 20),
        Step("terminating", 21),
        Step("terminated", 25),
    ]
    found = [(p.name, p.started_at, p.ended_at) for p in phases(history)]
    assert found == [
        ("provision", 0, 3),
        ("ssh", 3, 4),
        ("bootstrap", 4, 6),
        ("ssh", 6, 7),
        ("bootstrap", 7, 10),
        ("dispatch", 10, 11),
        ("run", 11, 20),
        ("teardown", 20, 25),
    ]


def test_an_ongoing_phase_has_no_end_and_counts_to_now() -> None:
    (provision, ssh) = phases([Step("requested", 0), Step("booting", 2)])
    assert ssh.ended_at is None and ssh.seconds(now=12) == 10
    assert provision.seconds(now=99) == 2
    assert phases([Step("requested", 0), Step("never_launched", 1)])[0].ended_at == 1
