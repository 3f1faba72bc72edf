"""The per-job log cap: how much output the store keeps of one job, newest bytes first.

A job that prints without end must not fill the control plane's disk; past the cap the oldest
lines go, and one marker line at the start of what is left says how much was cut. Pure.
"""

from __future__ import annotations

import re

from gpulayer.errors import UsageError

DEFAULT_MAX_LOG_BYTES = 1 << 30
MAX_LOG_BYTES_ENV = "GPULAYER_MAX_LOG_BYTES"
# Cutting takes the log this far below the cap, so that a job printing past it does not
# cut at every batch.
CUT_SLACK = 1 / 16

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1 << 10,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1 << 20,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1 << 30,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1 << 40,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*")


def parse_byte_size(text: str, flag: str = "--max-log-bytes") -> int:
    """``1GiB``, ``500MB``, ``64k`` or a plain number of bytes; at least 1 KiB."""
    match = _SIZE.fullmatch(text.lower())
    if not match or match.group(2) not in _UNITS:
        raise UsageError(f"{flag}: {text!r} is not a size such as 1GiB, 500MB or 1048576")
    size = int(float(match.group(1)) * _UNITS[match.group(2)])
    if size < 1024:
        raise UsageError(f"{flag}: {text!r} is less than the smallest cap, 1 KiB")
    return size


def cut_target(cap: int) -> int:
    """How many bytes to keep once a log went past ``cap``."""
    return cap - int(cap * CUT_SLACK)


def cut_marker(cut_bytes: int, cap: int) -> str:
    return (
        f"[gpulayer] log cut: the oldest {cut_bytes} bytes of this job's output were dropped "
        f"to keep it under the {cap}-byte log cap; the newest output follows\n"
    )
