"""Batch a job's output lines and ship them to the control plane a few times a second.

One call per line would make a chatty job as slow as its control plane; one call per batch
keeps `gpulayer logs -f` close to live.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("gpulayer.worker")

Sender = Callable[[list[tuple[str, str]]], None]
_MAX_PENDING = 200_000  # lines held while the control plane is away; the oldest go first


class LogShipper:
    def __init__(self, send: Sender, *, interval: float = 0.05, max_batch: int = 500) -> None:
        self._send = send
        self._interval = interval
        self._max_batch = max_batch
        self._pending: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()  # batches leave in the order lines came
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpulayer-logship", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add(self, stream: str, text: str) -> None:
        with self._lock:
            self._pending.append((stream, text))
            full = len(self._pending) >= self._max_batch
        if full:
            self._wake.set()

    def flush(self) -> None:
        with self._send_lock:
            self._flush_pending()

    def _flush_pending(self) -> None:
        while True:
            with self._lock:
                batch, self._pending = (
                    self._pending[: self._max_batch],
                    self._pending[self._max_batch :],
                )
            if not batch:
                return
            try:
                self._send(batch)
            except Exception as exc:
                # Keep the lines for the next try: the control plane may be restarting.
                log.warning("shipping %d log lines failed: %s", len(batch), exc)
                with self._lock:
                    self._pending[:0] = batch
                    overflow = len(self._pending) - _MAX_PENDING
                    if overflow > 0:
                        del self._pending[:overflow]
                return

    def close(self) -> None:
        self._closed.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.flush()

    def _loop(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(self._interval)
            self._wake.clear()
            self.flush()
