"""What a worker's claim long-poll waits on: a count per worker, bumped for its own news only
(an assignment, a cancel), so one job wakes one worker, not all of them.

A long-poll waits here without holding one of the HTTP server's worker threads (async_wait):
with a thread each, 40 idle workers took all of them, and every other call queued behind
their 30 s polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterable


class WorkerNews:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._listeners: dict[str, set[Callable[[], None]]] = {}

    def count(self, worker_id: str) -> int:
        with self._lock:
            return self._counts.get(worker_id, 0)

    def wake(self, worker_ids: Iterable[str | None]) -> None:
        """Tell these workers' long-polls (and only theirs) that news came."""
        ids = [w for w in worker_ids if w]
        if not ids:
            return
        woken: list[Callable[[], None]] = []
        with self._lock:
            for worker_id in ids:
                self._counts[worker_id] = self._counts.get(worker_id, 0) + 1
                woken.extend(self._listeners.get(worker_id, ()))
        for listener in woken:
            listener()

    async def async_wait(self, worker_id: str, since: int, timeout: float) -> None:
        """Wait on the event loop until the worker's count is no longer ``since``, or timeout."""
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def listener() -> None:
            # A loop that closed meanwhile has no poll left to wake.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(woken.set)

        if not self._listen(worker_id, since, listener):
            return
        try:
            # asyncio's own TimeoutError: the built-in one only from Python 3.11.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(woken.wait(), timeout)
        finally:
            self._unlisten(worker_id, listener)

    def wait(self, worker_id: str, since: int, timeout: float) -> None:
        """async_wait for a caller that blocks a thread of its own (claim_blocking)."""
        woken = threading.Event()
        listener = woken.set
        if not self._listen(worker_id, since, listener):
            return
        try:
            woken.wait(timeout)
        finally:
            self._unlisten(worker_id, listener)

    def _listen(self, worker_id: str, since: int, listener: Callable[[], None]) -> bool:
        """Add ``listener`` unless news came since ``since`` already (then False)."""
        with self._lock:
            if self._counts.get(worker_id, 0) != since:
                return False
            self._listeners.setdefault(worker_id, set()).add(listener)
        return True

    def _unlisten(self, worker_id: str, listener: Callable[[], None]) -> None:
        with self._lock:
            waiting = self._listeners.get(worker_id)
            if waiting is not None:
                waiting.discard(listener)
                if not waiting:
                    del self._listeners[worker_id]

    def listening(self) -> int:
        """How many long-polls wait now."""
        with self._lock:
            return sum(len(v) for v in self._listeners.values())
