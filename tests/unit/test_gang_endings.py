"""How a gang ends: a cancel or a timeout waits for every node, a node's own failure does not.
Pure decisions over attempt records."""

from __future__ import annotations

from gpulayer.control import gangs
from gpulayer.control.store import AttemptRecord


def node(
    rank: int, state: str = "running", reason: str | None = None, **extra: object
) -> AttemptRecord:
    fields: dict[str, object] = {"finished_at": None, "result": None, **extra}
    return AttemptRecord(
        id=rank + 1,
        job_id="j-1",
        number=1,
        worker_id=f"w-{rank}",
        gpu_indices=[],
        state=state,
        reason=reason,
        exit_code=None,
        created_at=0.0,
        started_at=0.0,
        node_rank=rank,
        **fields,  # type: ignore[arg-type]
    )


def test_a_cancel_winds_the_gang_down_until_every_node_has_reported() -> None:
    gang = [node(0), node(1, "cancelled", "cancelled", finished_at=5.0)]
    assert gangs.winding_down(gang, cancel_requested=True)
    assert not gangs.all_ended(gang)
    ended = [node(0, "cancelled", "cancelled", finished_at=6.0), gang[1]]
    assert gangs.all_ended(ended)


def test_a_timeout_winds_down_and_names_the_node_that_timed_out_first() -> None:
    gang = [
        node(0, "failed", "exit_code", finished_at=3.0),
        node(1, "failed", "timeout", finished_at=2.0),
        node(2, "failed", "timeout", finished_at=4.0),
    ]
    assert gangs.winding_down(gang, cancel_requested=False)
    first = gangs.first_timed_out(gang)
    assert first is not None and first.node_rank == 1


def test_a_node_failing_on_its_own_does_not_wind_down() -> None:
    gang = [node(0), node(1, "failed", "exit_code", finished_at=2.0)]
    assert not gangs.winding_down(gang, cancel_requested=False)
    assert gangs.first_timed_out(gang) is None


def test_node_zeros_result_is_the_gangs() -> None:
    reports = {"value": None, "metrics": [{"epoch": 0}], "node_rank": 0}
    gang = [node(1, result={"value": None}), node(0, result=reports)]
    assert gangs.leader_result(gang) == reports
