"""A long wait that must not stay silent (a wheelhouse build, a bootstrap): while open, a
reminder is said whenever nothing was said for a few seconds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType

QUIET_SECONDS = 4.0
"""Below the 5 s a cold path may stay silent, with room for a loaded machine."""


class QuietReminder:
    """A context: while open, calls ``remind`` whenever ``last_said()`` (a monotonic time) is
    ``every`` seconds old; ``begun`` is when it was made."""

    def __init__(
        self,
        last_said: Callable[[], float],
        remind: Callable[[], None],
        every: float = QUIET_SECONDS,
        name: str = "progress",
    ) -> None:
        self._last_said = last_said
        self._remind = remind
        self._every = every
        self.begun = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self) -> QuietReminder:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(min(0.5, self._every / 4)):
            if time.monotonic() - self._last_said() >= self._every:
                self._remind()
