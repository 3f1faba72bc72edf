"""Processes seen through /proc: one process's stat line, the whole table, whether a pid
still names a live process. Shared by the worker (which ends process trees) and the local
control plane's client side (which waits for a daemon to exit), so neither imports the other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
GONE_STATES = frozenset({"Z", "X", "x"})


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    pgrp: int
    session: int
    state: str
    start_time: int
    """Clock ticks after boot; with the pid it names one process for good."""


def parse_stat(text: str) -> ProcStat:
    """Parse /proc/<pid>/stat. The command name may hold spaces and parentheses, so split
    after its last ')'."""
    head, _, rest = text.rpartition(")")
    pid = int(head.split("(", 1)[0])
    fields = rest.split()
    return ProcStat(
        pid=pid,
        state=fields[0],
        ppid=int(fields[1]),
        pgrp=int(fields[2]),
        session=int(fields[3]),
        start_time=int(fields[19]),
    )


def read_stat(pid: int) -> ProcStat | None:
    return _read_stat_at(f"{PROC}/{pid}/stat")


def _read_stat_at(path: str) -> ProcStat | None:
    # Plain open and bytes: a worker reads every process's line at each scan of the table.
    try:
        with open(path, "rb") as stream:
            return parse_stat(stream.read().decode(errors="replace"))
    except (OSError, ValueError, IndexError):
        return None


def proc_table() -> list[ProcStat]:
    table = []
    for entry in os.scandir(PROC):
        if entry.name.isdigit():
            stat = _read_stat_at(f"{entry.path}/stat")
            if stat is not None:
                table.append(stat)
    return table


def is_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    if PROC.is_dir():
        stat = read_stat(pid)
        return stat is not None and stat.state not in GONE_STATES
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
