"""Finding a test job's processes in /proc by a marker in their argv, and waiting for things."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

# Python that forks a daemon leaving the session (setsid, then a second fork) that sleeps: the
# shape of a job whose processes try to outlive it. The same argv (and so any marker in it) is
# the daemon's too, since it never execs.
DAEMON_PREAMBLE = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(600)
    os._exit(0)
"""


def processes_with(marker: str, *, attempt: int | None = None) -> list[int]:
    """Live processes whose argv holds marker (and, if given, whose GPULAYER_ATTEMPT is it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() not in (entry / "cmdline").read_bytes():
                continue
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
            if state in ("Z", "X"):
                continue
            if attempt is not None:
                environ = (entry / "environ").read_bytes().split(b"\0")
                if f"GPULAYER_ATTEMPT={attempt}".encode() not in environ:
                    continue
        except (OSError, IndexError):
            continue
        found.append(int(entry.name))
    return found


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"after {timeout} s: {what}")


def process_ended(pid: int, timeout: float) -> bool:
    """Whether the process ends within ``timeout``: no longer there, or a zombie (dead, waiting
    for whichever process it was handed to, here or an init that reaps slowly, to collect it)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
