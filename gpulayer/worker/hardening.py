"""What a worker does to itself so that its jobs cannot read its memory.

A job running as the worker's own user could otherwise read the worker's credential from
``/proc/<worker>/mem`` or ``environ`` (or attach a debugger). A non-dumpable process's /proc
files belong to root and it cannot be traced by its own user; its children are dumpable again
once they exec, so jobs are not affected. Standard library only.
"""

from __future__ import annotations

import ctypes
import sys

_PR_SET_DUMPABLE = 4
_PR_GET_DUMPABLE = 3


def make_non_dumpable() -> bool:
    """True when this process is now non-dumpable (Linux); False elsewhere or on failure."""
    if sys.platform != "linux":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if int(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)) != 0:
            return False
        return int(libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False
