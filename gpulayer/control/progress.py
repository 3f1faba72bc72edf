"""The server's own progress, so that its stalls are never held against its workers.

A worker is judged lost by how long it has been silent. Wall time alone would blame the worker
for any time the server itself could not hear it: the whole process frozen (SIGSTOP, a VM
paused, swapped out), or its event loop or its thread pool too busy to take the heartbeats that
were waiting in its socket. So the request side of the server beats here a few times a second
(a beat is a round trip through the event loop and the thread pool that run heartbeats), and a
gap between beats longer than ``max_step`` is a stall: the time past ``max_step`` is taken out
of every worker's silence that it overlaps. Silence is then "time the server was able to hear
the worker and did not".
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

BEAT_SECONDS = 0.2
MAX_STEP_SECONDS = 1.0
_KEPT_STALLS = 4096


class ServerProgress:
    def __init__(
        self, *, max_step: float = MAX_STEP_SECONDS, clock: Callable[[], float] = time.time
    ) -> None:
        self._max_step = max_step
        self._clock = clock
        self._lock = threading.Lock()
        self._last_beat: float | None = None
        self._stalls: deque[tuple[float, float]] = deque(maxlen=_KEPT_STALLS)
        """(start, end) wall times when the server could not take calls, oldest first."""

    @property
    def beating(self) -> bool:
        with self._lock:
            return self._last_beat is not None

    def beat(self) -> None:
        now = self._clock()
        with self._lock:
            last = self._last_beat
            if last is not None and now - last > self._max_step:
                self._stalls.append((last + self._max_step, now))
            self._last_beat = now

    def stalled_between(self, start: float, end: float) -> float:
        """Seconds of [start, end] the server spent stalled, the stall going on now included."""
        with self._lock:
            stalls = list(self._stalls)
            last = self._last_beat
        if last is not None and end - last > self._max_step:
            stalls.append((last + self._max_step, end))
        total = 0.0
        for stall_start, stall_end in stalls:
            total += max(0.0, min(end, stall_end) - max(start, stall_start))
        return total

    def silence(self, since: float, now: float | None = None) -> float:
        """How long the server has been able to hear something silent since ``since``."""
        end = self._clock() if now is None else now
        return max(0.0, (end - since) - self.stalled_between(since, end))
