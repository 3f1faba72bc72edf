"""A minimal Debian root filesystem for test hosts that share nothing with the controller.

Built once with ``mmdebstrap`` from Debian's packages (about a minute and 240 MB) and cached,
keyed by its suite, variant and package list, under ``/var/cache/gpulayer-tests`` (or
``GPULAYER_TEST_ROOTFS_CACHE``). Hosts mount it read-only as the lower layer of an overlay, so
each host writes only its own upper layer: what a job installs on one host is on no other.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

SUITE = "bookworm"
VARIANT = "apt"
PACKAGES = (
    "python3", "python3-venv", "openssh-server", "iproute2",
    # A Slurm compute or login node of the test cluster: its daemons and commands are its own.
    "slurmd", "slurm-client", "munge", "mount",
)  # fmt: skip
CACHE_ENV = "GPULAYER_TEST_ROOTFS_CACHE"
_BUILD_SECONDS = 900


class RootfsError(RuntimeError):
    """The root filesystem could not be built."""


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or "/var/cache/gpulayer-tests")


def key() -> str:
    recipe = f"{SUITE}|{VARIANT}|{','.join(sorted(PACKAGES))}"
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def available() -> bool:
    """Whether a root filesystem is cached or can be built here."""
    return os.geteuid() == 0 and (
        _complete(cache_root() / f"rootfs-{key()}") or shutil.which("mmdebstrap") is not None
    )


def _complete(directory: Path) -> bool:
    return (directory / ".complete").is_file()


@contextlib.contextmanager
def _lock(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / f".rootfs-{key()}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a parallel run waits for the one building
        yield
    finally:
        os.close(fd)


def ensure() -> Path:
    """The unpacked root filesystem, built first if it is not cached yet."""
    root = cache_root()
    directory = root / f"rootfs-{key()}"
    if _complete(directory):
        return directory
    with _lock(root):
        if _complete(directory):
            return directory
        tarball = root / f"rootfs-{key()}.tar"
        if not tarball.is_file():
            _build(tarball)
        partial = root / f"rootfs-{key()}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        done = subprocess.run(
            ["tar", "-C", str(partial), "--numeric-owner", "-xpf", str(tarball)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            raise RootfsError(f"unpacking {tarball} failed: {done.stderr.strip()[-400:]}")
        (partial / ".complete").write_text(f"{SUITE} {VARIANT} {' '.join(PACKAGES)}\n")
        shutil.rmtree(directory, ignore_errors=True)
        partial.rename(directory)
    return directory


def _build(tarball: Path) -> None:
    if shutil.which("mmdebstrap") is None:
        raise RootfsError("mmdebstrap is missing: apt-get install -y mmdebstrap")
    partial = tarball.with_suffix(".tar.partial")
    argv = [
        "mmdebstrap",
        "--quiet",
        f"--variant={VARIANT}",
        f"--include={','.join(PACKAGES)}",
        "--format=tar",
        SUITE,
        str(partial),
    ]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=_BUILD_SECONDS, check=False
        )
    except subprocess.TimeoutExpired:
        partial.unlink(missing_ok=True)
        raise RootfsError(f"mmdebstrap took more than {_BUILD_SECONDS} s") from None
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RootfsError(f"mmdebstrap failed: {done.stderr.strip()[-400:]}")
    partial.rename(tarball)
