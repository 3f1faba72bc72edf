"""A @gl.remote function the schedule tests run on a cron (imported by its module name)."""

from __future__ import annotations

import gpulayer as gl


@gl.remote
def add(a: int, b: int) -> int:
    return a + b
