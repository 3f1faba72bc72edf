"""A worker's identity on its control plane (its id and credential), kept across restarts.

A worker that registered keeps what the control plane gave it in a 0600 file under its home,
so a restarted worker comes back as itself (a new epoch of the same worker, its old attempts
given up) instead of registering again: a join token's ``--max-workers`` then counts machines,
not restarts. The file belongs to the worker's user; a worker that runs its jobs as another
user (``--run-as``, ``--run-as-range``) keeps it out of their reach. Delete it to join anew.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

FILE_NAME = "worker-identity.json"


@dataclass(frozen=True)
class WorkerIdentity:
    server_url: str
    worker_id: str
    token: str


def load_identity(path: Path, server_url: str) -> WorkerIdentity | None:
    """The identity saved for this control plane, or None (none saved, another server's, or
    a file that is not one)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        identity = WorkerIdentity(
            str(data["server_url"]), str(data["worker_id"]), str(data["token"])
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return identity if identity.server_url == server_url.rstrip("/") else None


def save_identity(path: Path, identity: WorkerIdentity) -> None:
    """Write the file 0600 from its first byte, then move it in place whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(
            {
                "server_url": identity.server_url,
                "worker_id": identity.worker_id,
                "token": identity.token,
            },
            out,
        )
    os.replace(partial, path)
