"""What a machine's orderly shutdown does to the test hosts' services, as clouds do it on a
terminate or a spot reclaim (EC2's shutdown, GCE's ACPI soft-off): the worker gets SIGTERM and
time to end before the host goes."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

SHUTDOWN_SECONDS = 90.0
"""How long a machine's shutdown waits for its services to stop (systemd's default)."""
WORKER_ARGV = ["-m", "gpulayer", "worker", "start"]


def stop_services(pids: Sequence[int]) -> None:
    """What a machine's shutdown does first: SIGTERM to its services (here, the gpulayer
    worker the bootstrap started), then wait for them to end before the machine goes. The
    network and the SSH sessions stay up meanwhile, as they do until late in a shutdown."""
    workers = [pid for pid in pids if _runs(pid, WORKER_ARGV)]
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + SHUTDOWN_SECONDS
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling /proc: a process of another PID namespace cannot be waited on


def _runs(pid: int, argv: Sequence[str]) -> bool:
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    wanted = [word.encode() for word in argv]
    return any(words[i : i + len(wanted)] == wanted for i in range(len(words)))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
