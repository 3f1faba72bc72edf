"""A bootstrap's output as lines for its observer (the job's log), never silent for long: when
nothing was said for a few seconds, a line says what it still waits for and since when."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpulayer.cloud.bootstrap.commands import PHASE_PREFIX
from gpulayer.cloud.quiet_reminder import QUIET_SECONDS, QuietReminder

if TYPE_CHECKING:
    from gpulayer.ssh.session import Stream

log = logging.getLogger("gpulayer.bootstrap")

TAIL_LINES = 40
PROGRESS_SECONDS = QUIET_SECONDS


class Lines:
    """Turns output pieces into lines for ``on_output`` and keeps the last ones; the token is
    masked should any output ever carry it. Safe to call from the ticker's thread too."""

    def __init__(self, on_output: Callable[[str], None], secret: str) -> None:
        self._on_output = on_output
        self._secret = secret
        self._partial: dict[str, str] = {"stdout": "", "stderr": ""}
        self._lock = threading.RLock()
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.seen: list[str] = []
        self.last_said = time.monotonic()
        self.doing = "starting"
        """The last phase said: what a quiet stretch is waiting for."""

    def emit(self, line: str) -> None:
        line = line.replace(self._secret, "***") if self._secret else line
        with self._lock:
            self.tail.append(line)
            self.seen.append(line)
            self.last_said = time.monotonic()
            if line.startswith(PHASE_PREFIX) and not line.startswith(f"{PHASE_PREFIX} still:"):
                self.doing = line[len(PHASE_PREFIX) :].strip()
            try:
                self._on_output(line)
            except Exception:  # a failing observer must not fail the bootstrap
                log.exception("bootstrap output callback failed")

    def feed(self, stream: Stream, text: str) -> None:
        with self._lock:
            buffered = self._partial[stream] + text
            *complete, rest = buffered.split("\n")
            self._partial[stream] = rest
            for line in complete:
                self.emit(line.rstrip("\r"))

    def flush(self) -> None:
        with self._lock:
            for stream, rest in self._partial.items():
                if rest:
                    self.emit(rest)
                self._partial[stream] = ""


class Ticker(QuietReminder):
    """While open, says ``still: <last phase> (N s)`` whenever ``lines`` were quiet for
    ``every`` seconds."""

    def __init__(self, lines: Lines, every: float = PROGRESS_SECONDS) -> None:
        self._lines = lines
        super().__init__(lambda: lines.last_said, self._still, every, name="bootstrap-progress")

    def _still(self) -> None:
        waited = time.monotonic() - self.begun
        self._lines.emit(f"{PHASE_PREFIX} still: {self._lines.doing} ({waited:.0f} s in)")
