"""A job array's waiting jobs are planned together and launched by one call, in the pure parts
of the lifecycle: which jobs a pass plans together and when, and which task records wait for
their array's call rather than launching on their own."""

from __future__ import annotations

from gpulayer.cloud.lifecycle.arrays import (
    ARRAY_GATHER_SECONDS,
    ARRAY_LAUNCH_TAG,
    ARRAY_MISSING_SECONDS,
    ArrayProvider,
    array_of,
    index_of,
    limit_of,
    plan_groups,
    size_of,
    waits_for_array_call,
)
from gpulayer.cloud.lifecycle.decide import InstanceFacts, Submit, decide
from gpulayer.cloud.lifecycle.world import World, decide_pass


def test_an_arrays_jobs_are_planned_under_its_first() -> None:
    arrays = {"j-1": "a-1", "j-3": "a-1", "j-4": "a-2", "j-5": "a-1"}
    firsts, together = plan_groups(["j-0", "j-1", "j-3", "j-4", "j-5"], arrays)
    assert firsts == ("j-0", "j-1", "j-4")
    assert together == {"j-1": ("j-3", "j-5")}


def test_an_arrays_jobs_wait_until_none_joined_it_for_a_moment() -> None:
    waiting = [("j-1", "cloud"), ("j-2", "cloud"), ("j-9", "cloud")]
    world = World([], waiting, arrays={"j-1": ("a-1", 100.0), "j-2": ("a-1", 100.4)})
    soon = decide_pass(world, 100.5)
    # A job of no array is planned at once; the array's wait for the last one to join.
    assert soon.plan == ("j-9",)
    assert {f.key: f.not_before for f in soon.follow_ups} == {
        "j-1": 100.4 + ARRAY_GATHER_SECONDS,
        "j-2": 100.4 + ARRAY_GATHER_SECONDS,
    }
    later = decide_pass(world, 100.4 + ARRAY_GATHER_SECONDS)
    assert later.plan == ("j-1", "j-9")
    assert later.plan_with == {"j-1": ("j-2",)}


def test_an_array_of_known_size_is_planned_once_all_its_jobs_wait() -> None:
    some = World(
        [],
        [("j-1", "cloud"), ("j-2", "cloud")],
        arrays={"j-1": ("a-1", 100.0), "j-2": ("a-1", 101.5)},
        array_sizes={"a-1": 3},
    )
    # Two of three: the third is on its way (sent one by one), however slowly.
    early = decide_pass(some, 103.0)
    assert early.plan == ()
    assert {f.not_before for f in early.follow_ups} == {101.5 + ARRAY_MISSING_SECONDS}
    every = World(
        [],
        [("j-1", "cloud"), ("j-2", "cloud"), ("j-3", "cloud")],
        arrays={"j-1": ("a-1", 100.0), "j-2": ("a-1", 101.5), "j-3": ("a-1", 103.0)},
        array_sizes={"a-1": 3},
    )
    # All three wait: planned at once, together.
    now = decide_pass(every, 103.0)
    assert now.plan == ("j-1",) and now.plan_with == {"j-1": ("j-2", "j-3")}
    # One never came (cancelled): the others go once none joined for a while.
    late = decide_pass(some, 101.5 + ARRAY_MISSING_SECONDS)
    assert late.plan == ("j-1",) and late.plan_with == {"j-1": ("j-2",)}


def test_a_task_waits_for_its_arrays_call() -> None:
    tags = {ARRAY_LAUNCH_TAG: "r-first"}
    assert waits_for_array_call("r-other", "requested", tags)
    assert not waits_for_array_call("r-first", "requested", tags)
    assert not waits_for_array_call("r-other", "launching", tags)
    assert not waits_for_array_call("r-lone", "requested", {})


def test_a_task_waiting_for_its_arrays_call_makes_none_of_its_own() -> None:
    waiting = InstanceFacts(state="requested", since=0.0, array_call_pending=True)
    assert list(decide(waiting, 1.0, deadman_seconds=600.0)) == []
    # Once the call moved it to launching, its own launch waits for its task to run.
    moved = InstanceFacts(state="launching", since=1.0)
    assert list(decide(moved, 2.0, deadman_seconds=600.0)) == [Submit("launch")]
    first = InstanceFacts(state="requested", since=0.0)
    assert list(decide(first, 1.0, deadman_seconds=600.0)) == [Submit("launch")]


def test_a_jobs_array_labels_are_read() -> None:
    labels = {
        "gpulayer.array": "a-1",
        "gpulayer.array.index": "4",
        "gpulayer.array.limit": "2",
        "gpulayer.array.size": "10",
    }
    assert (array_of(labels), index_of(labels), limit_of(labels)) == ("a-1", 4, 2)
    assert (size_of(labels), size_of({})) == (10, None)
    assert (array_of({}), index_of({}), limit_of({})) == (None, None, None)
    assert limit_of({"gpulayer.array.limit": "0"}) is None


def test_a_provider_makes_arrays_only_with_launch_array() -> None:
    class Lone:
        name = "lone"

    class Arrays(Lone):
        def launch_array(self, offer: object, requests: object, limit: object) -> list[str]:
            return []

    assert not isinstance(Lone(), ArrayProvider)
    assert isinstance(Arrays(), ArrayProvider)
