"""Batch a job's output lines and ship them to the control plane a few times a second.

One call per line would make a chatty job as slow as its control plane; one call per batch
keeps `gpulayer logs -f` close to live. The first batch waits a little longer
(``first_delay``): most short jobs have ended by then, and their lines travel with the outcome
instead of costing requests of their own. ``hurry()`` ends that wait: the worker calls it on
the job's first output line, so only its own notes (a silent short job's "running ..." and exit
lines) are held.

The queue between the job and the control plane is bounded in bytes: when it is full, adding
waits (and with it the thread reading the job's pipes, so the job itself blocks on its next
write) until batches have left. A job printing faster than its control plane stores, or while
the control plane is away, costs no memory.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

log = logging.getLogger("gpulayer.worker")

Sender = Callable[[list[tuple[str, str]]], None]
MAX_PENDING_BYTES = 8 << 20
_MAX_RETRY_DELAY = 2.0


class LogShipper:
    def __init__(
        self,
        send: Sender,
        *,
        interval: float = 0.2,
        first_delay: float = 1.0,
        max_batch: int = 500,
        max_pending_bytes: int = MAX_PENDING_BYTES,
        close_timeout: float = 60.0,
    ) -> None:
        self._send = send
        self._interval = interval
        self._first_delay = max(first_delay, interval)
        self._max_batch = max_batch
        self._max_pending_bytes = max_pending_bytes
        self._close_timeout = close_timeout
        self._pending: deque[tuple[str, str]] = deque()
        self._pending_bytes = 0
        self._room = threading.Condition()
        self._send_lock = (
            threading.Lock()
        )  # one batch in flight: they leave in the order lines came
        self._wake = threading.Event()
        self._hurried = False
        self._closed = threading.Event()
        self._abandoned = False
        self._failures = 0
        self._thread = threading.Thread(target=self._loop, name="gpulayer-logship", daemon=True)

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    def start(self) -> None:
        self._thread.start()

    def add(self, stream: str, text: str) -> None:
        """Queue a line; blocks while the queue is full (backpressure)."""
        size = len(text)
        with self._room:
            while (
                self._pending
                and self._pending_bytes + size > self._max_pending_bytes
                and not self._abandoned
            ):
                self._wake.set()
                self._room.wait(0.5)
            self._pending.append((stream, text))
            self._pending_bytes += size
            full = len(self._pending) >= self._max_batch
        if full:
            self._wake.set()

    def flush(self) -> bool:
        """Send what is queued; False when a send failed (the lines stay for the next try)."""
        with self._send_lock:
            while True:
                with self._room:
                    batch = list(itertools.islice(self._pending, self._max_batch))
                if not batch:
                    return True
                try:
                    self._send(batch)
                except Exception as exc:
                    self._failures += 1
                    if self._failures == 1 or self._failures % 20 == 0:
                        log.warning(
                            "shipping %d log lines failed (%d times so far): %s",
                            len(batch),
                            self._failures,
                            exc,
                        )
                    return False
                self._failures = 0
                with self._room:
                    for _ in batch:
                        self._pending.popleft()
                    self._pending_bytes -= sum(len(text) for _, text in batch)
                    self._room.notify_all()

    def take(self, max_bytes: int) -> list[tuple[str, str]] | None:
        """Everything queued, taken out to travel with another request; None (and nothing
        taken) when more than one batch of ``max_bytes`` is queued."""
        with self._send_lock, self._room:
            if self._pending_bytes > max_bytes or len(self._pending) > self._max_batch:
                return None
            lines = list(self._pending)
            self._pending.clear()
            self._pending_bytes = 0
            self._room.notify_all()
            return lines

    def close(self) -> None:
        """Stop the loop and ship what is left, for up to close_timeout seconds while the
        control plane is away; after that the rest is dropped with a warning."""
        self._closed.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        deadline = time.monotonic() + self._close_timeout
        while not self.flush():
            if time.monotonic() >= deadline:
                with self._room:
                    dropped = len(self._pending)
                    self._pending.clear()
                    self._pending_bytes = 0
                    self._abandoned = True
                    self._room.notify_all()
                log.warning("dropped %d log lines: the control plane did not take them", dropped)
                return
            time.sleep(self._retry_delay())

    def _retry_delay(self) -> float:
        return min(self._interval * (2 ** min(self._failures, 10)), _MAX_RETRY_DELAY)

    def hurry(self) -> None:
        """Ship at the usual pace from now on, the first batch at once."""
        if not self._hurried:
            self._hurried = True
            self._wake.set()

    def _loop(self) -> None:
        # A full batch wakes the loop early, so the first delay holds back little output.
        first_until = time.monotonic() + self._first_delay
        while not self._closed.is_set():
            if self._failures:
                delay = self._retry_delay()
            elif self._hurried:
                delay = self._interval
            else:
                delay = max(self._interval, first_until - time.monotonic())
            self._wake.wait(delay)
            self._wake.clear()
            self.flush()
