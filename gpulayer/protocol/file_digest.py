"""The sha256 of a file's bytes, read in chunks: how a bundle is named on both sides of the
worker protocol (the server's kept bundles, a worker's cache)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_of_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
