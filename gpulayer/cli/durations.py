"""Durations a person types: 90, 90s, 30m, 12h, 7d, 2w."""

from __future__ import annotations

import re

from gpulayer.errors import UsageError

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")


def parse_duration(text: str, flag: str) -> float:
    """Seconds; a UsageError naming the flag for anything else."""
    match = _DURATION.match(text.lower())
    if match is None:
        raise UsageError(f"{flag}: {text!r} is not a duration like 90s, 30m, 12h or 7d")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds <= 0:
        raise UsageError(f"{flag}: must be longer than 0")
    return seconds
