"""Removing what a uid left in the kernel (IPC objects, keyrings), so the next attempt that
gets the uid cannot attach to it.

SysV shared memory, semaphores and message queues, POSIX message queues and the uid's own
keyrings outlive every process that made them: a 64 MiB segment or a key of one attempt's
secrets stays readable by whoever runs as that uid next. SysV objects are listed in
/proc/sysvipc (with their owner and creator) and removed by id; POSIX queues are files of the
mqueue filesystem, removed by owner there (where the machine has no mqueue filesystem mounted,
the worker mounts one, root only, to see them); the user, user-session and persistent keyrings
of a uid that /proc/key-users lists are emptied by a short process running as that uid (only
it can name them), its keys invalidated first so none stays readable by its id.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import subprocess
from collections.abc import Callable, Container
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


_KEY_USERS = Path("/proc/key-users")
# keyctl(2): the syscall's number differs by architecture; glibc has no wrapper.
_KEYCTL_SYSCALL = {"x86_64": 250, "aarch64": 219, "ppc64le": 283, "s390x": 280}
_KEYCTL_CLEAR, _KEYCTL_READ, _KEYCTL_INVALIDATE, _KEYCTL_GET_PERSISTENT = 7, 11, 21, 22
_USER_KEYRING, _USER_SESSION_KEYRING = -4, -5


def uids_with_keys(uids: Container[int]) -> list[int]:
    """The uids of the range that the kernel holds keys (keyrings included) for."""
    try:
        lines = _KEY_USERS.read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        uid_text = line.split(":", 1)[0].strip()
        if uid_text.isdigit() and int(uid_text) in uids:
            found.append(int(uid_text))
    return found


def _keyring_emptier() -> Callable[[], None] | None:
    """What a process running as the uid calls, between fork and exec, to invalidate every key
    of its keyrings and unlink them all (errors passed over: a keyring it never had has
    nothing to leave). Made in the worker: the child may not be able to read a module file."""
    import platform

    number = _KEYCTL_SYSCALL.get(platform.machine())
    libc = _libc()
    if number is None or libc is None:
        return None
    ids = (ctypes.c_int32 * 4096)()
    capacity = ctypes.sizeof(ids)
    keyctl = libc.syscall

    def empty() -> None:
        persistent = keyctl(number, _KEYCTL_GET_PERSISTENT, -1, _USER_SESSION_KEYRING)
        for keyring in (persistent, _USER_KEYRING, _USER_SESSION_KEYRING):
            if keyring == -1:
                continue
            size = keyctl(number, _KEYCTL_READ, keyring, ids, capacity)
            for index in range(max(0, min(size, capacity)) // 4):
                keyctl(number, _KEYCTL_INVALIDATE, ids[index])
            keyctl(number, _KEYCTL_CLEAR, keyring)

    return empty


def clear_keyrings_of(uids: Container[int]) -> int:
    """Empty the keyrings of the uids that have any; for how many uids."""
    found = uids_with_keys(uids)
    empty = _keyring_emptier() if found else None
    if empty is None:
        return 0
    cleared = 0
    for uid in found:
        try:
            subprocess.run(
                ["/bin/true"],
                user=uid,
                group=uid,
                extra_groups=[],
                preexec_fn=empty,
                close_fds=True,
                cwd="/",
                env={},
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("cannot empty the keyrings of uid %d (%s)", uid, exc)
            continue
        cleared += 1
    return cleared


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
