"""A worker's disk: attempt folders that go once their attempt is over, and whether there is
room enough to take another job.

A finished attempt's folder holds what its job wrote (its unpacked source, inputs, outputs,
temp files): kept, a job that fills the disk fills it for every later job. It is removed as
soon as the attempt's outputs are stored, or after ``--keep-attempts`` hours for one who wants
to look into it. A worker that lacks room anyway (the disk filled by something else) takes no
job it could not prepare: it says it is degraded until room returns.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Container
from pathlib import Path

from gpulayer.worker.attempt_quota import unmount_quota

log = logging.getLogger("gpulayer.worker")

DISK_FULL = "disk full"
# Room a worker needs to take a job: this much, or this share of a smaller filesystem.
_MIN_FREE_BYTES = 256 * 1024 * 1024
_MIN_FREE_SHARE = 0.05
_MIN_FREE_INODES = 1000


def disk_trouble(root: Path) -> str | None:
    """Why the work dir has no room for another job, or None when it has."""
    try:
        info = os.statvfs(root)
    except OSError:
        return None  # cannot tell: the job's own preparation will say
    size = info.f_blocks * info.f_frsize
    free = info.f_bavail * info.f_frsize
    if free < min(_MIN_FREE_BYTES, size * _MIN_FREE_SHARE):
        return DISK_FULL
    if info.f_files and info.f_favail < min(_MIN_FREE_INODES, info.f_files * _MIN_FREE_SHARE):
        return DISK_FULL
    return None


def remove_attempt_folder(folder: Path, *, maybe_mounted: bool = True) -> None:
    """Remove an ended attempt's folder (never following a link out of it; first unmounted,
    where it is a filesystem of its own), and its job's folder once no attempt is left in it.
    ``maybe_mounted`` False: the worker made it a plain folder (no quota), nothing to unmount."""
    if folder.is_symlink() or not folder.is_dir():
        return
    if maybe_mounted:
        unmount_quota(folder)
    shutil.rmtree(folder, onerror=_noted)
    with contextlib.suppress(OSError):
        folder.parent.rmdir()  # only when empty: another attempt of the job may be there


def _noted(function: object, path: str, excinfo: object) -> None:
    log.warning("cannot remove %s of an ended attempt (%s)", path, excinfo)


def attempt_folders(work_root: Path) -> list[Path]:
    """``JOB/attempt-N`` folders under the work root (links are no folders of the worker's)."""
    found = []
    with contextlib.suppress(OSError):
        for job in work_root.iterdir():
            if job.name.startswith(".") or job.is_symlink() or not job.is_dir():
                continue
            with contextlib.suppress(OSError):
                found += [
                    a
                    for a in job.iterdir()
                    if a.name.startswith("attempt-") and not a.is_symlink() and a.is_dir()
                ]
    return found


def sweep_attempt_folders(
    work_root: Path, keep_seconds: float, live: Container[Path], now: float | None = None
) -> int:
    """Remove the folders of ended attempts (any not ``live``) older than ``keep_seconds``,
    counted from when their attempt ended (the folder's time, set then); how many."""
    now = time.time() if now is None else now
    removed = 0
    for folder in attempt_folders(work_root):
        if folder in live:
            continue
        try:
            ended = folder.lstat().st_mtime
        except OSError:
            continue
        if now - ended >= keep_seconds:
            remove_attempt_folder(folder)
            removed += 1
    return removed
