"""Attempts ending together share a report request; each gets its own outcome or the
request's error, and a lone report is not held back."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from gpulayer.protocol.messages import AttemptReport, FinishOutcome
from gpulayer.worker.finish_batch import FinishBatcher

DONE = AttemptReport(state="succeeded", exit_code=0)


def wait_until(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.01)


class SlowControlPlane:
    """Answers each request only once the test lets it, so that reports pile up meanwhile."""

    def __init__(self) -> None:
        self.requests: list[list[int]] = []
        self.release = threading.Semaphore(0)
        self.arrived = threading.Semaphore(0)

    def send(self, reports: Sequence[tuple[int, AttemptReport]]) -> list[FinishOutcome]:
        self.requests.append([attempt for attempt, _ in reports])
        self.arrived.release()
        assert self.release.acquire(timeout=10)
        return [
            FinishOutcome(attempt_id=a, outcome="stale" if a % 2 else "recorded")
            for a, _ in reports
        ]


def _finish_in_threads(
    batcher: FinishBatcher, attempts: range
) -> tuple[dict[int, str], list[threading.Thread]]:
    outcomes: dict[int, str] = {}

    def one(attempt: int) -> None:
        outcomes[attempt] = batcher.finish(attempt, DONE).outcome

    threads = [threading.Thread(target=one, args=(a,)) for a in attempts]
    for thread in threads:
        thread.start()
    return outcomes, threads


def test_reports_ending_during_a_request_share_the_next_one() -> None:
    plane = SlowControlPlane()
    batcher = FinishBatcher(plane.send)
    first: dict[int, str] = {}
    lone = threading.Thread(target=lambda: first.update({0: batcher.finish(0, DONE).outcome}))
    lone.start()
    assert plane.arrived.acquire(timeout=10)  # the lone report left at once, alone
    outcomes, threads = _finish_in_threads(batcher, range(1, 21))
    wait_until(lambda: batcher.waiting == 20)
    for _ in range(21):
        plane.release.release()  # the first request returns; the 20 waiting leave together
    for thread in [lone, *threads]:
        thread.join(10)
    assert plane.requests[0] == [0]
    assert sorted(plane.requests[1]) == list(range(1, 21))
    assert len(plane.requests) == 2
    assert first == {0: "recorded"}
    assert outcomes == {a: "stale" if a % 2 else "recorded" for a in range(1, 21)}


def test_a_failed_request_reaches_every_report_it_carried() -> None:
    def away(_reports: Sequence[tuple[int, AttemptReport]]) -> list[FinishOutcome]:
        raise ConnectionError("control plane restarting")

    batcher = FinishBatcher(away)
    with pytest.raises(ConnectionError):
        batcher.finish(7, DONE)
    with pytest.raises(ConnectionError):  # the batcher is not left stuck "sending"
        batcher.finish(8, DONE)


def test_a_reply_without_an_attempts_outcome_is_an_error_for_that_attempt() -> None:
    batcher = FinishBatcher(lambda reports: [])
    with pytest.raises(RuntimeError, match="attempt 3"):
        batcher.finish(3, DONE)


def test_a_batch_holds_at_most_max_batch_reports() -> None:
    plane = SlowControlPlane()
    batcher = FinishBatcher(plane.send, max_batch=4)
    lone = threading.Thread(target=batcher.finish, args=(0, DONE))
    lone.start()
    assert plane.arrived.acquire(timeout=10)
    _, threads = _finish_in_threads(batcher, range(1, 11))
    wait_until(lambda: batcher.waiting == 10)
    for _ in range(12):
        plane.release.release()
    for thread in [lone, *threads]:
        thread.join(10)
    assert [len(r) for r in plane.requests] == [1, 4, 4, 2]
    assert sorted(a for r in plane.requests for a in r) == list(range(11))


def test_a_batch_stays_within_its_byte_budget() -> None:
    """Reports with big results leave in several requests, each within the budget (the
    server caps this route's body); one over the budget alone still leaves, alone."""
    plane = SlowControlPlane()
    big = AttemptReport(state="succeeded", exit_code=0, result="r" * 4000)
    batcher = FinishBatcher(plane.send, max_bytes=10_000)
    lone = threading.Thread(target=batcher.finish, args=(0, DONE))
    lone.start()
    assert plane.arrived.acquire(timeout=10)
    threads = [threading.Thread(target=batcher.finish, args=(a, big)) for a in range(1, 8)]
    huge = AttemptReport(state="succeeded", exit_code=0, result="h" * 50_000)
    threads.append(threading.Thread(target=batcher.finish, args=(8, huge)))
    for thread in threads:
        thread.start()
    wait_until(lambda: batcher.waiting == 8)
    for _ in range(10):
        plane.release.release()
    for thread in [lone, *threads]:
        thread.join(10)
    assert sorted(a for r in plane.requests for a in r) == list(range(9))
    sizes = {0: len(DONE.model_dump_json()), 8: len(huge.model_dump_json())}
    for request in plane.requests[1:]:
        total = sum(sizes.get(a, len(big.model_dump_json())) for a in request)
        assert total <= 10_000 or len(request) == 1, request
    assert [8] in plane.requests
