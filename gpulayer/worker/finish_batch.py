"""Attempts that end together report in one request.

Each attempt's thread hands its report over and waits for its own outcome. Whichever thread
finds no request in flight sends everything waiting (up to one batch) and hands each waiting
thread its outcome; the rest wait meanwhile. A lone report leaves at once, as it would alone;
under load, the reports that end while one request is in flight share the next one. An error
of the request itself (the control plane away, a refused credential) reaches every thread
whose report it carried, and each retries or gives up as it would alone. A batch also stays
within a byte budget, well inside the server's cap on this route's body (64 MiB): reports with
big results go in several requests, and one over the budget goes alone (a single report, its
result at most 16 MiB, always fits the cap).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpulayer.protocol.messages import MAX_FINISHES_PER_BATCH, AttemptReport, FinishOutcome

Send = Callable[[Sequence[tuple[int, AttemptReport]]], list[FinishOutcome]]

BATCH_BYTES = 24 * 1024 * 1024


@dataclass
class _Waiting:
    attempt_id: int
    report: AttemptReport
    size: int = 0
    """The report's size as JSON: what it adds to a request's body."""
    done: bool = False
    outcome: FinishOutcome | None = None
    error: BaseException | None = None


class FinishBatcher:
    def __init__(
        self, send: Send, max_batch: int = MAX_FINISHES_PER_BATCH, max_bytes: int = BATCH_BYTES
    ) -> None:
        self._send = send
        self._max_batch = max_batch
        self._max_bytes = max_bytes
        self._queue: list[_Waiting] = []
        self._sending = False
        self._changed = threading.Condition()

    @property
    def waiting(self) -> int:
        """Reports waiting for a request to carry them."""
        with self._changed:
            return len(self._queue)

    def finish(self, attempt_id: int, report: AttemptReport) -> FinishOutcome:
        """This attempt's outcome once a request carried its report; the request's error
        is raised here when it failed."""
        mine = _Waiting(attempt_id, report, len(report.model_dump_json()))
        with self._changed:
            self._queue.append(mine)
            while True:
                while self._sending and not mine.done:
                    self._changed.wait()
                if mine.done:
                    return _outcome_of(mine)
                self._sending = True
                batch = self._queue[: self._fitting()]
                del self._queue[: len(batch)]
                self._changed.release()
                try:
                    self._deliver(batch)
                finally:
                    self._changed.acquire()
                    self._sending = False
                    self._changed.notify_all()

    def _fitting(self) -> int:
        """How many waiting reports the next request takes: at least one."""
        total = 0
        for count, waiting in enumerate(self._queue[: self._max_batch]):
            total += waiting.size
            if count and total > self._max_bytes:
                return count
        return min(len(self._queue), self._max_batch)

    def _deliver(self, batch: list[_Waiting]) -> None:
        try:
            outcomes = self._send([(w.attempt_id, w.report) for w in batch])
        except BaseException as exc:  # every report it carried shares the error
            for waiting in batch:
                waiting.error = exc
                waiting.done = True
            return
        by_attempt = {o.attempt_id: o for o in outcomes}
        for waiting in batch:
            found = by_attempt.get(waiting.attempt_id)
            if found is None:
                waiting.error = RuntimeError(
                    f"the control plane's reply named no outcome for attempt {waiting.attempt_id}"
                )
            waiting.outcome = found
            waiting.done = True


def _outcome_of(waiting: _Waiting) -> FinishOutcome:
    if waiting.error is not None:
        raise waiting.error
    assert waiting.outcome is not None
    return waiting.outcome
