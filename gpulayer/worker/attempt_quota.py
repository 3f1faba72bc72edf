"""A disk quota per attempt: its folder is a filesystem of its own, of a fixed size.

A job can fill whatever filesystem its folder lies on while it runs, and with it every other
attempt's room and the worker's caches. With ``--attempt-disk-quota SIZE`` (a root worker) each
attempt's folder is an ext4 filesystem in a sparse image file beside it (``attempt-N.img``,
0600), loop-mounted ``nosuid,nodev``: the job's source, inputs, outputs and ``TMPDIR`` can take
SIZE and no more, and a job that fills it fails alone (ENOSPC in its own folder). Project quotas
would need the work dir's filesystem mounted with them; an image works on any.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

from gpulayer.errors import GpulayerError, UsageError

FLAG = "--attempt-disk-quota"
_MKFS = "mkfs.ext4"


class QuotaError(GpulayerError):
    """An attempt's filesystem could not be made or mounted."""


def image_of(folder: Path) -> Path:
    return folder.with_name(folder.name + ".img")


def check_quota_possible() -> None:
    """UsageError (one line) where per-attempt filesystems cannot be made here."""
    if os.geteuid() != 0:
        raise UsageError(f"{FLAG}: only a worker running as root can mount a folder per attempt")
    for tool in (_MKFS, "mount", "umount"):
        if shutil.which(tool, path="/usr/sbin:/sbin:/usr/bin:/bin") is None:
            raise UsageError(f"{FLAG}: {tool} is not installed (Debian: e2fsprogs, mount)")
    if not Path("/dev/loop-control").exists():
        raise UsageError(f"{FLAG}: this machine has no loop devices (/dev/loop-control)")


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()
        raise QuotaError(f"{argv[0]}: {tail[-1] if tail else f'exit {done.returncode}'}")


def mount_quota(folder: Path, size: int) -> None:
    """Make ``folder`` (new and empty) a filesystem of ``size`` bytes of its own."""
    image = image_of(folder)
    fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    try:
        # No journal and no reserved blocks: scratch space, used whole, thrown away after.
        _run([_MKFS, "-q", "-F", "-m", "0", "-O", "^has_journal",
              "-E", "lazy_itable_init=1", str(image)])  # fmt: skip
        _run(["mount", "-o", "loop,nosuid,nodev", str(image), str(folder)])
        os.chmod(folder, 0o700)
    except (QuotaError, OSError, subprocess.SubprocessError):
        image.unlink(missing_ok=True)
        raise


def unmount_quota(folder: Path) -> None:
    """Unmount an attempt's filesystem (if it is one) and remove its image. Lazily: a process
    the worker could not end keeps it only until that process ends."""
    if os.path.ismount(folder):
        with contextlib.suppress(QuotaError, OSError, subprocess.SubprocessError):
            _run(["umount", "-l", str(folder)])
    image_of(folder).unlink(missing_ok=True)
