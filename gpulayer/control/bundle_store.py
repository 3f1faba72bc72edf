"""Source bundles kept once by content: ``bundles/<sha256>.tar.gz`` under the server's home.

A submit asks for a digest first and uploads only a bundle the server lacks; each job's
``source.tar.gz`` is a hard link to the kept file (a copy where links do not work), and a
``bundle.sha256`` beside it names the digest, so a worker can cache bundles by digest too.
A kept bundle goes when the last job linking it is deleted. A schedule holds its source's
bytes in the store; each run keeps them here again if they went, and links them the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

from gpulayer.errors import BundleNotKeptError, UsageError

DIGEST_PREFIX = "sha256:"
_HEX = re.compile(r"[0-9a-f]{64}")
DIGEST_FILE = "bundle.sha256"


def parse_digest(bundle_id: str, field: str = "bundle_id") -> str | None:
    """The hex digest of a content-addressed bundle id, None for any other id."""
    if not bundle_id.startswith(DIGEST_PREFIX):
        return None
    digest = bundle_id[len(DIGEST_PREFIX) :]
    if not _HEX.fullmatch(digest):
        raise UsageError(f"{field}: {DIGEST_PREFIX} must be followed by 64 lowercase hex digits")
    return digest


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class BundleStore:
    def __init__(self, root: Path) -> None:
        self.root = root / "bundles"
        self._staging = root / "incoming"  # same filesystem: a finished write moves in whole

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

    def link_into(self, digest: str, destination: Path) -> None:
        """Give a job the bundle: a hard link to the kept file, and its digest beside it."""
        if not self._link(digest, destination):
            raise BundleNotKeptError(f"bundle_id: {DIGEST_PREFIX}{digest} was not uploaded")

    def link_bytes_into(self, data: bytes, destination: Path) -> str:
        """Give a job a bundle held as bytes elsewhere (a schedule's source in the store):
        kept here by digest when absent, then linked as an upload is, so that workers fetch
        it once for every job of that content. Returns the digest."""
        digest = hashlib.sha256(data).hexdigest()
        # Twice at most: the last job linking the kept file may be deleted in between.
        for _ in range(2):
            if not self.has(digest):
                self._write(digest, data)
            if self._link(digest, destination):
                return digest
        raise UsageError(f"bundle_id: {DIGEST_PREFIX}{digest} went while a job was linking it")

    def _write(self, digest: str, data: bytes) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._staging.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=self._staging, suffix=".tar.gz", delete=False) as out:
            out.write(data)
        os.replace(out.name, self.path(digest))

    def _link(self, digest: str, destination: Path) -> bool:
        """False when the kept file is not there."""
        kept = self.path(digest)
        if not kept.is_file():
            return False
        destination.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(kept, destination)
        except FileNotFoundError:
            return False
        except OSError:
            try:
                shutil.copyfile(kept, destination)
            except FileNotFoundError:
                return False
        (destination.parent / DIGEST_FILE).write_text(digest)
        return True

    @staticmethod
    def digest_of(job_dir: Path) -> str | None:
        """The digest of a job's bundle, when it came from this store."""
        try:
            digest = (job_dir / DIGEST_FILE).read_text().strip()
        except OSError:
            return None
        return digest if _HEX.fullmatch(digest) else None

    def release(self, digest: str) -> None:
        """A job linking this bundle is gone: drop the kept file once no job links it."""
        kept = self.path(digest)
        with contextlib.suppress(FileNotFoundError):
            if kept.stat().st_nlink <= 1:
                kept.unlink()
