"""Whether the installed distributions may have changed since a long-running process looked,
and whether one was installed after this process started.

A team server outlives installs (`pip install gpulayer-aws` while it runs). importlib.metadata
reads entry points afresh at each call, but a control plane keeps what it validated and built
per state of providers.yaml; :func:`installed_key` is the other half of that state, cheap
enough to take at every use: one stat per folder on sys.path (installing or removing a
distribution adds or removes entries in its folder, which changes the folder's mtime).

A plugin that still does not import once found (an editable install: its path hook is added by
a .pth file, which only a starting interpreter reads) needs a restart, and
:func:`installed_after_start` tells the error to say so.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time
from importlib.metadata import EntryPoint
from pathlib import Path

_IMPORTED_AT = time.time()
_lock = threading.Lock()
_last_key: tuple[tuple[str, int], ...] | None = None


def installed_key() -> tuple[tuple[str, int], ...]:
    """Each sys.path folder with its mtime (-1: missing, or not a folder). When it differs
    from the one seen last, the import system's caches are cleared so new modules are found."""
    global _last_key
    key = tuple((entry, _mtime(entry)) for entry in sys.path)
    with _lock:
        changed = _last_key is not None and key != _last_key
        _last_key = key
    if changed:
        importlib.invalidate_caches()
    return key


def _mtime(entry: str) -> int:
    try:
        return os.stat(entry or ".").st_mtime_ns
    except OSError:
        return -1


def installed_after_start(ep: EntryPoint) -> bool:
    """Whether the distribution that registers ``ep`` was installed (its metadata written)
    after this process started."""
    dist = getattr(ep, "dist", None)
    folder = getattr(dist, "_path", None)  # a PathDistribution's metadata folder
    if folder is None:
        return False
    try:
        written = Path(folder).stat().st_mtime
    except OSError:
        return False
    return written > process_started()


def process_started() -> float:
    """When this process started (the epoch), from /proc where there is one; else when this
    module was first imported."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/stat") as lines:
            boot = next(float(line.split()[1]) for line in lines if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED_AT
