"""Removing what a uid left in the kernel's IPC objects, so the next attempt that gets the uid
cannot attach to it.

SysV shared memory, semaphores and message queues, and POSIX message queues, outlive every
process that made them: a 64 MiB segment of one attempt's secrets stays readable by whoever
runs as that uid next. SysV objects are listed in /proc/sysvipc (with their owner and creator)
and removed by id; POSIX queues are files of the mqueue filesystem, removed by owner there.
Where the machine has no mqueue filesystem mounted, the worker mounts one (root only) to see
them.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import subprocess
from collections.abc import Container
from pathlib import Path

log = logging.getLogger("gpulayer.worker")

_SYSVIPC = Path("/proc/sysvipc")
_IPC_RMID = 0
# The id column of each table, and the call that removes one of its objects.
_KINDS = {"shm": ("shmid", "shmctl"), "sem": ("semid", "semctl"), "msg": ("msqid", "msgctl")}
_OWN_MQUEUE = Path("/run/gpulayer/mqueue")


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def sysv_objects_of(uids: Container[int]) -> list[tuple[str, int]]:
    """(kind, id) of every SysV IPC object whose owner or creator is one of the uids."""
    found = []
    for kind, (id_column, _) in _KINDS.items():
        try:
            lines = (_SYSVIPC / kind).read_text().splitlines()
        except OSError:
            continue
        if not lines:
            continue
        header = lines[0].split()
        for line in lines[1:]:
            fields = dict(zip(header, line.split(), strict=False))
            try:
                owners = {int(fields["uid"]), int(fields["cuid"])}
                ident = int(fields[id_column])
            except (KeyError, ValueError):
                continue
            if any(uid in uids for uid in owners):
                found.append((kind, ident))
    return found


def remove_sysv_of(uids: Container[int]) -> int:
    """Remove the uids' SysV IPC objects; how many. A segment still attached elsewhere goes
    once it is detached, and no one can attach to it by its key meanwhile."""
    libc = _libc()
    if libc is None:
        return 0
    removed = 0
    for kind, ident in sysv_objects_of(uids):
        call = getattr(libc, _KINDS[kind][1])
        # semctl takes a semaphore number before the command; the others take a buffer after.
        args = (ident, 0, _IPC_RMID) if kind == "sem" else (ident, _IPC_RMID, None)
        if call(*args) == 0:
            removed += 1
    return removed


def mqueue_folder() -> Path | None:
    """Where this machine's POSIX message queues can be listed: a mounted mqueue filesystem,
    else one the worker mounts (as root) at /run/gpulayer/mqueue; None where neither is."""
    try:
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) >= 3 and fields[2] == "mqueue":
                return Path(fields[1])
    except OSError:
        return None
    if os.geteuid() != 0:
        return None
    try:
        _OWN_MQUEUE.mkdir(mode=0o700, parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "mqueue", "mqueue", str(_OWN_MQUEUE)],
            check=True,
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("cannot mount an mqueue filesystem to find jobs' message queues (%s)", exc)
        return None
    return _OWN_MQUEUE


def remove_mqueues_of(uids: Container[int], folder: Path | None) -> int:
    """Remove the POSIX message queues the uids own; how many."""
    if folder is None:
        return 0
    removed = 0
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid in uids:
                    os.unlink(entry.path)
                    removed += 1
    return removed
