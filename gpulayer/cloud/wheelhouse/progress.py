"""What a wheelhouse build says while it runs: what it builds and for how long, at least every
few seconds, so a first job's wait is never silent. Lines go to the caller (a job's log), else
to a live status line on a terminal, else to the log."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

from gpulayer.cloud.quiet_reminder import QUIET_SECONDS, QuietReminder

log = logging.getLogger("gpulayer.wheelhouse")

PROGRESS_SECONDS = QUIET_SECONDS


class BuildProgress:
    """A context: ``say`` a step; while open, the current step is said again with the time
    spent whenever ``every`` seconds passed without a line."""

    def __init__(
        self, on_progress: Callable[[str], None] | None, every: float = PROGRESS_SECONDS
    ) -> None:
        self._on_progress = on_progress
        self._begun = time.monotonic()
        self._last = self._begun
        self._doing = ""
        self._lock = threading.Lock()
        self._reminder = QuietReminder(
            lambda: self._last, self._again, every, name="wheelhouse-progress"
        )
        self._status: Any = None

    def __enter__(self) -> BuildProgress:
        if self._on_progress is None and sys.stderr.isatty():
            from rich.console import Console

            self._status = Console(stderr=True).status("")
            self._status.start()
        self._reminder.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._reminder.__exit__(kind, error, trace)
        if self._status is not None:
            self._status.stop()

    def say(self, doing: str) -> None:
        with self._lock:
            self._doing = doing
        self._emit(doing)

    def _emit(self, doing: str) -> None:
        with self._lock:
            self._last = time.monotonic()
            line = f"{doing} ({self._last - self._begun:.0f} s)"
        if self._on_progress is not None:
            try:
                self._on_progress(line)
            except Exception:  # an observer that fails must not fail the build
                log.exception("wheelhouse progress callback failed")
        elif self._status is not None:
            self._status.update(line)
        else:
            log.info("%s", line)

    def _again(self) -> None:
        with self._lock:
            doing = self._doing
        if doing:
            self._emit(doing)


@contextlib.contextmanager
def held(path: Any, progress: BuildProgress, what: str) -> Iterator[None]:
    """An exclusive lock on the file ``path`` (one build of a wheelhouse at a time, across
    processes and GPULAYER_HOMEs), saying while it waits. Where the platform has no ``flock``
    the builds go on side by side; their atomic rename still leaves one whole wheelhouse."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress.say(f"waiting for another process building {what}")
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
