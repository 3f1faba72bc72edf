"""Source bundles kept once by content: ``bundles/<sha256>.tar.gz`` under the server's home.

A submit asks for a digest first and uploads only a bundle the server lacks; a job's row names
its bundle by digest, and workers cache bundles by digest too. A kept bundle goes when the last
job naming it is deleted. A schedule holds its source's bytes in the store; each run keeps them
here again if they went. Jobs stored before schema 10 have their bundle in their own folder
instead: a hard link to the kept file, with ``bundle.sha256`` beside it naming the digest.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
import threading
from pathlib import Path

from gpulayer.errors import BundleNotKeptError, UsageError
from gpulayer.protocol.file_digest import sha256_of_file

DIGEST_PREFIX = "sha256:"
_HEX = re.compile(r"[0-9a-f]{64}")
DIGEST_FILE = "bundle.sha256"  # beside a job's own bundle file (before schema 10)


def parse_digest(bundle_id: str, field: str = "bundle_id") -> str | None:
    """The hex digest of a content-addressed bundle id, None for any other id."""
    if not bundle_id.startswith(DIGEST_PREFIX):
        return None
    digest = bundle_id[len(DIGEST_PREFIX) :]
    if not _HEX.fullmatch(digest):
        raise UsageError(f"{field}: {DIGEST_PREFIX} must be followed by 64 lowercase hex digits")
    return digest


file_digest = sha256_of_file


class BundleStore:
    def __init__(self, root: Path) -> None:
        self.root = root / "bundles"
        self._staging = root / "incoming"  # same filesystem: a finished write moves in whole
        # Held from checking a bundle is kept to writing the job row that names it, and from
        # finding no row names a bundle to removing it: no job is left naming a removed file.
        self.lock = threading.Lock()

    def path(self, digest: str) -> Path:
        return self.root / f"{digest}.tar.gz"

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def keep(self, upload: Path) -> str:
        """Take an uploaded (already checked) bundle in; returns its digest."""
        digest = file_digest(upload)
        self.root.mkdir(parents=True, exist_ok=True)
        kept = self.path(digest)
        if kept.exists():
            upload.unlink(missing_ok=True)
        else:
            os.replace(upload, kept)
        return digest

    def read(self, digest: str, field: str = "bundle_id") -> bytes:
        """The kept bundle's bytes; the kept file stays (later submits may link it)."""
        try:
            return self.path(digest).read_bytes()
        except FileNotFoundError:
            raise BundleNotKeptError(f"{field}: {DIGEST_PREFIX}{digest} was not uploaded") from None

    def require(self, digest: str, field: str = "bundle_id") -> None:
        """Refuse a digest whose bundle is not kept; call it holding :attr:`lock`."""
        if not self.has(digest):
            raise BundleNotKeptError(f"{field}: {DIGEST_PREFIX}{digest} was not uploaded")

    def keep_bytes(self, data: bytes) -> str:
        """Keep a bundle held as bytes elsewhere (a schedule's source in the store), when it
        is not kept already, so that workers fetch it once for every job of that content.
        Returns the digest; call it holding :attr:`lock`."""
        digest = hashlib.sha256(data).hexdigest()
        if not self.has(digest):
            staged = self.staging_path()
            staged.write_bytes(data)
            self.root.mkdir(parents=True, exist_ok=True)
            os.replace(staged, self.path(digest))
        return digest

    def staging_path(self) -> Path:
        """A fresh path to write a bundle at before :meth:`keep` takes it in."""
        self._staging.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(dir=self._staging, suffix=".tar.gz")
        os.close(handle)
        return Path(name)

    @staticmethod
    def digest_of(job_dir: Path) -> str | None:
        """The digest of a job's bundle, when it came from this store."""
        try:
            digest = (job_dir / DIGEST_FILE).read_text().strip()
        except OSError:
            return None
        return digest if _HEX.fullmatch(digest) else None

    def release(self, digest: str) -> None:
        """No job row names this bundle any more: drop the kept file unless a job stored
        before schema 10 still links it. Call it holding :attr:`lock`."""
        kept = self.path(digest)
        with contextlib.suppress(FileNotFoundError):
            if kept.stat().st_nlink <= 1:
                kept.unlink()
