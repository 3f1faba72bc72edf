"""A reentrant lock that goes to its waiters in the order they came.

Python's own locks let whichever thread the scheduler wakes first take them, so under a burst
of writers one request can lose the race again and again: on a two-core machine a submit was
seen waiting 44 s on SQLite's writer lock while a thousand others went through.
"""

from __future__ import annotations

import threading
from collections import deque
from types import TracebackType


class FairRLock:
    """Reentrant, first come first served: the thread that releases hands the lock to the
    longest waiter directly, so no newcomer can take it in between."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._owner: int | None = None
        self._depth = 0
        self._waiters: deque[tuple[int, threading.Lock]] = deque()

    def acquire(self) -> None:
        me = threading.get_ident()
        with self._guard:
            if self._owner == me:
                self._depth += 1
                return
            if self._owner is None:
                self._owner, self._depth = me, 1
                return
            gate = threading.Lock()
            gate.acquire()
            self._waiters.append((me, gate))
        # The releasing thread makes this one the owner before it opens the gate.
        try:
            gate.acquire()
        except BaseException:
            # Interrupted (Ctrl-C) while waiting: leave the queue, or pass on what was handed.
            self._give_up((me, gate))
            raise

    def _give_up(self, waiter: tuple[int, threading.Lock]) -> None:
        with self._guard:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
                return
        if self._owner == waiter[0]:
            self.release()

    def release(self) -> None:
        with self._guard:
            if self._owner != threading.get_ident():
                raise RuntimeError("release of a FairRLock this thread does not hold")
            self._depth -= 1
            if self._depth:
                return
            if not self._waiters:
                self._owner = None
                return
            self._owner, gate = self._waiters.popleft()
            self._depth = 1
            gate.release()

    @property
    def waiting(self) -> int:
        """How many threads wait for the lock now."""
        with self._guard:
            return len(self._waiters)

    def __enter__(self) -> FairRLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()
