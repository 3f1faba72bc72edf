"""A live phase display for people at a terminal: while a job is being placed and its machine
prepared, a spinner names the current phase; each finished phase stays as a line."""

from __future__ import annotations

import sys
from typing import Any


class PhaseDisplay:
    """Shows gpulayer's own notes (system lines) as phases; job output passes through."""

    def __init__(self) -> None:
        self._status: Any = None
        self._console: Any = None
        if sys.stderr.isatty():
            from rich.console import Console

            self._console = Console(stderr=True, highlight=False)

    @property
    def live(self) -> bool:
        return self._console is not None

    def phase(self, text: str) -> None:
        if self._console is None:
            return
        if self._status is None:
            self._status = self._console.status(text, spinner="dots")
            self._status.start()
        else:
            self._status.update(text)
        self._console.print(f"[dim]gpulayer:[/] {text}")

    def output_started(self) -> None:
        """The job's own output begins: the spinner would only get in its way."""
        self.close()

    def close(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
