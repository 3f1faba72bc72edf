"""When this control plane last answered a call, and since when workers could reach it."""

from __future__ import annotations

import time


class ServingClock:
    def __init__(self) -> None:
        self.last_call = time.monotonic()
        self.started = time.time()
        """Since when a worker's silence counts against it (see touch)."""
        self.serving = False
        """Whether this control plane has answered a call yet."""

    def touch(self) -> None:
        self.last_call = time.monotonic()
        if not self.serving:
            # Workers could not reach us before we answered our first call: their silence
            # counts from now, not from when this process began starting up.
            self.serving = True
            self.started = time.time()
