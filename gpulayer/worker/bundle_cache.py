"""The worker's cache of source bundles: one file per bundle's SHA-256 under the work root,
shared by the worker's attempts, each of which unpacks its own copy.

A job of a worker that cannot isolate it may rewrite the cache, so a cached bundle is used
only once its bytes match its digest again, read without following links, and only from a
folder of the worker's own. Its own module so the agent keeps to running assignments.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import re
import shutil
import stat
import threading
from collections.abc import Callable
from pathlib import Path

from gpulayer.protocol.file_digest import sha256_of_file

log = logging.getLogger("gpulayer.worker")

# Source bundles by their SHA-256, under the work root, shared by the worker's attempts.
BUNDLE_CACHE = ".bundles"
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


sha256_of = sha256_of_file


def own_folder(path: Path) -> bool:
    try:
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()


def copy_if_intact(cached: Path, copy: Path, digest: str) -> bool:
    """Copy a cached bundle for one attempt if its bytes still have ``digest``: read without
    following a link, only a plain file of the worker's, in a folder of the worker's. A
    cached file that fails is removed (the next fetch replaces it)."""
    if not own_folder(cached.parent):
        return False
    try:
        fd = os.open(cached, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    hasher = hashlib.sha256()
    with os.fdopen(fd, "rb") as stream:
        info = os.fstat(stream.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            intact = False
        else:
            out_fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(out_fd, "wb") as out:
                for chunk in iter(functools.partial(stream.read, 1 << 20), b""):
                    hasher.update(chunk)
                    out.write(chunk)
            intact = hasher.hexdigest() == digest
    if not intact:
        log.warning("cached bundle %s does not match its digest; fetching it again", digest)
        copy.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            cached.unlink()
    return intact


def source_bundle(
    digest: str | None,
    attempt_dir: Path,
    work_root: Path,
    fetch: Callable[[], object],
    locks_lock: threading.Lock,
    locks: dict[str, threading.Lock],
) -> Path:
    """The job's source bundle: a copy of this worker's cached one, taken only once its
    bytes match the digest (a job of a worker that cannot isolate it may have rewritten
    the cache), else fetched by ``fetch`` into ``attempt_dir/source.tar.gz`` (and, once its
    digest checks out, kept in the cache for the next job with that source). The job unpacks
    its own copy, never the cached file. ``locks`` (guarded by ``locks_lock``) holds one lock
    per digest, so attempts of one source fetch it once."""
    fetched = attempt_dir / "source.tar.gz"
    if digest is None or not _HEX_DIGEST.fullmatch(digest):
        fetch()
        return fetched
    cache = work_root / BUNDLE_CACHE
    cached = cache / f"{digest}.tar.gz"
    copy = attempt_dir / "source.cached.tar.gz"
    if copy_if_intact(cached, copy, digest):
        return copy
    with locks_lock:
        lock = locks.setdefault(digest, threading.Lock())
    with lock:
        if copy_if_intact(cached, copy, digest):
            return copy
        fetch()
        if sha256_of(fetched) != digest:
            return fetched  # not what it claims to be: use it for this job, cache nothing
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not own_folder(cache):
            return fetched  # not the worker's folder (a link a job put there): keep nothing
        partial = cache / f".{digest}.{attempt_dir.name}.{threading.get_ident()}"
        shutil.copyfile(fetched, partial)
        os.replace(partial, cached)
        return fetched
