"""A small on-disk JSON cache with a time-to-live, for catalog data providers fetch slowly
(instance types, zones, prices) and that changes rarely."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def default_cache_dir(provider: str) -> Path:
    """``$GPULAYER_HOME/cache/<provider>``, else the user cache directory."""
    home = os.environ.get("GPULAYER_HOME")
    if home:
        return Path(home) / "cache" / provider
    import platformdirs

    return Path(platformdirs.user_cache_dir("gpulayer")) / provider


def default_state_dir(provider: str) -> Path:
    """``$GPULAYER_HOME/<provider>-provider``, else the user data directory's: where a plugin
    keeps what it must not lose (claims, allocations), unlike a cache."""
    home = os.environ.get("GPULAYER_HOME")
    if home:
        return Path(home) / f"{provider}-provider"
    import platformdirs

    return Path(platformdirs.user_data_dir("gpulayer", appauthor=False)) / f"{provider}-provider"


def write_json_atomically(path: Path, value: Any, *, indent: int | None = None) -> Path:
    """Write ``value`` as JSON to ``path`` through a temporary file in the same folder, so a
    concurrent reader sees the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(value, handle, indent=indent)
            if indent is not None:
                handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


class DiskCache:
    """Values are JSON documents, one file per key, replaced atomically so that concurrent
    readers never see half a file. ``clock`` returns seconds since the epoch."""

    def __init__(self, directory: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.directory = Path(directory)
        self._clock = clock

    def path(self, key: str) -> Path:
        # Keys may hold URLs or region lists; keep the file name readable but safe and unique.
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        stem = _UNSAFE.sub("_", key)[:80]
        return self.directory / f"{stem}-{digest}.json"

    def get(self, key: str, ttl_seconds: float) -> Any | None:
        """The stored value when younger than ``ttl_seconds``, else None."""
        try:
            record = json.loads(self.path(key).read_text())
            stored_at = float(record["stored_at"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if self._clock() - stored_at > ttl_seconds:
            return None
        return record.get("value")

    def put(self, key: str, value: Any) -> None:
        record = {"key": key, "stored_at": self._clock(), "value": value}
        write_json_atomically(self.path(key), record)

    def get_or_fetch(self, key: str, ttl_seconds: float, fetch: Callable[[], T]) -> T:
        cached = self.get(key, ttl_seconds)
        if cached is not None:
            return cached
        value = fetch()
        self.put(key, value)
        return value
