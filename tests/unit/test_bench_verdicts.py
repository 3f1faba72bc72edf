"""The benchmark judges its numbers against the aims it was written for, in one line each."""

from __future__ import annotations

from bench.faults import isolation_verdict


def latency(worker: float, fresh: float) -> dict[str, tuple[float, float]]:
    return {
        "as the worker": (worker, worker * 2),
        "one shared uid": (worker, worker * 2),
        "a fresh uid each": (fresh, fresh * 2),
    }


def test_a_fresh_uid_within_the_aim_is_judged_within() -> None:
    line = isolation_verdict(latency(0.010, 0.0115))
    assert "1.15x" in line and "aim: within 1.2x" in line and line.endswith("within the aim")


def test_a_fresh_uid_over_the_aim_is_judged_over() -> None:
    line = isolation_verdict(latency(0.010, 0.015))
    assert "1.50x" in line and line.endswith("OVER the aim")
