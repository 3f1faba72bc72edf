"""What a ``--run-as-range`` needs of its machine before a worker starts with it.

* The range is this worker's alone. A worker ends every process of its uids that it does not
  know (what an earlier life left), so two workers sharing a uid would kill each other's jobs.
  Each worker holds a lock on its uids for as long as it lives: a POSIX record lock on the
  bytes [FIRST, LAST] of one machine-wide file, so any overlap between two ranges conflicts,
  and the kernel lets go when the worker dies however it dies.
* The range's users can run the worker's interpreter: a `python` job, a function and setup
  all run through it, and an interpreter in a home closed to them (a venv under a 0700 /root)
  fails every job with exit 126.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import struct
import subprocess
import sys
from pathlib import Path

from gpulayer.errors import UsageError
from gpulayer.spec.models import is_reserved_env_name
from gpulayer.worker.identities import FLAG, UidRange

LOCK_FILE = Path("/run/gpulayer/uid-ranges.lock")


class RangeLock:
    """The held lock on a range's uids; released by close() or when the process ends."""

    def __init__(self, fd: int, uids: UidRange) -> None:
        self.fd = fd
        self.uids = uids

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _holder(fd: int, uids: UidRange) -> int | None:
    """The pid holding a lock that overlaps the range (Linux's struct flock), if one is seen."""
    # short l_type, short l_whence, off_t l_start, off_t l_len, pid_t l_pid (native layout)
    layout = "hhqqi"
    query = struct.pack(layout, fcntl.F_WRLCK, os.SEEK_SET, uids.first, len(uids), 0)
    try:
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query.ljust(64, b"\0"))
    except OSError:
        return None
    kind, _, _, _, pid = struct.unpack(layout, answer[: struct.calcsize(layout)])
    return pid if kind != fcntl.F_UNLCK and pid > 0 else None


def lock_range(uids: UidRange, lock_file: Path = LOCK_FILE) -> RangeLock:
    """Take the machine-wide lock on the range's uids, or raise UsageError (one line) when
    another live worker holds any of them."""
    try:
        lock_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise UsageError(
            f"{FLAG}: cannot open the machine's lock {lock_file} ({exc.strerror})"
        ) from None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, len(uids), uids.first, os.SEEK_SET)
    except OSError:
        holder = _holder(fd, uids)
        os.close(fd)
        by = f" (worker pid {holder})" if holder else ""
        raise UsageError(
            f"{FLAG}: uids of {uids.first}-{uids.last} are held by another worker on this "
            f"machine{by}; give each worker a range of its own"
        ) from None
    return RangeLock(fd, uids)


def closed_folder(path: Path, uid: int) -> Path | None:
    """The first folder on the way to ``path`` that a user with this uid (and gid, and no
    other group) cannot pass through; None when every one lets it."""
    for folder in [*reversed(path.parents)]:
        try:
            info = folder.stat()
        except OSError:
            return folder
        if info.st_uid == uid:
            allowed = info.st_mode & stat.S_IXUSR
        elif info.st_gid == uid:
            allowed = info.st_mode & stat.S_IXGRP
        else:
            allowed = info.st_mode & stat.S_IXOTH
        if not allowed:
            return folder
    return None


def check_interpreter(uids: UidRange, python: str = sys.executable) -> None:
    """Run the interpreter as the range's first uid, as a job would; UsageError (one line)
    when it cannot (the uids differ only in number: one stands for all)."""
    uid = uids.first
    closed = closed_folder(Path(python), uid)
    reason = f"{closed} is closed to them" if closed is not None else ""
    if not reason:
        try:
            done = subprocess.run(
                [python, "-c", "import gpulayer"],
                cwd="/",
                # As a job's: the worker's environment less gpulayer's own names (its token).
                env={k: v for k, v in os.environ.items() if not is_reserved_env_name(k)},
                user=uid,
                group=uid,
                extra_groups=[],
                capture_output=True,
                timeout=60,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            reason = str(exc)
        else:
            if done.returncode != 0:
                tail = done.stderr.decode(errors="replace").strip().splitlines()
                reason = f"exit {done.returncode}: {tail[-1] if tail else 'no message'}"
    if reason:
        raise UsageError(
            f"{FLAG}: its uids cannot execute this worker's interpreter {python} ({reason}); "
            "install gpulayer where they can reach it (such as a venv under /opt)"
        )
