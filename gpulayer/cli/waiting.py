"""A line on stderr for a wait that may be long (the control plane asking clouds for offers,
a catalog refresh): nothing for the first two seconds, so quick answers stay quiet and
stdout holds only the answer; then a spinner on a terminal, or one plain line elsewhere (a
log, a pipe), saying what is awaited."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

QUIET_SECONDS = 2.0

# What a slow wait for the control plane says while it asks the providers' APIs.
ASKING_CLOUDS = (
    "waiting for the providers' {what} (one that does not answer is given up after "
    "gpulayer.cloud_wait_seconds, 30 s by default)"
)


class Progress:
    """What a wait shows once it is slow; :meth:`update` names a later step."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._lock = threading.Lock()
        self._status: Any = None
        self._shown = False
        self._ended = False

    def show(self) -> None:
        from rich.console import Console

        with self._lock:
            if self._ended or self._shown:
                return
            self._shown = True
            console = Console(stderr=True, highlight=False)
            if sys.stderr.isatty():
                self._status = console.status(self._text, spinner="dots")
                self._status.start()
            else:
                console.print(f"gpulayer: {self._text}", markup=False, soft_wrap=True)

    def update(self, text: str) -> None:
        with self._lock:
            self._text = text
            if self._status is not None:
                self._status.update(text)

    def end(self) -> None:
        with self._lock:
            self._ended = True
            if self._status is not None:
                self._status.stop()
                self._status = None


@contextmanager
def progress_after(text: str, quiet_seconds: float = QUIET_SECONDS) -> Iterator[Progress]:
    """Show ``text`` on stderr if the block is still running after ``quiet_seconds``."""
    progress = Progress(text)
    timer = threading.Timer(quiet_seconds, progress.show)
    timer.daemon = True
    timer.start()
    try:
        yield progress
    finally:
        timer.cancel()
        progress.end()
