"""The store's files are the owner's alone (0600): server.db and its -wal and -shm, made by a
real server process; an older store left 0644 is tightened when it is opened."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpulayer.control.store import Store
from tests.support.servers import ServerProcess


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_server_store_files_are_0600(tmp_path: Path) -> None:
    old_umask = os.umask(0o022)  # what a login shell has: files are 0644 unless made otherwise
    try:
        server = ServerProcess(tmp_path / "server").start()
    finally:
        os.umask(old_umask)
    try:
        client = server.client()
        client.submit(
            {
                "workload": {"kind": "command", "command": ["true"]},
                "placement": {"target": "remote"},
            }
        )
        database = server.home / "server.db"
        files = [database, Path(f"{database}-wal"), Path(f"{database}-shm")]
        for path in files:
            assert path.exists(), path
            assert mode(path) == 0o600, (path, oct(mode(path)))
    finally:
        server.stop()


def test_an_older_world_readable_store_is_tightened(tmp_path: Path) -> None:
    database = tmp_path / "state.db"
    Store(f"sqlite:///{database}").close()
    for suffix in ("", "-wal", "-shm"):
        candidate = Path(f"{database}{suffix}")
        if candidate.exists():
            candidate.chmod(0o644)
    store = Store(f"sqlite:///{database}")
    try:
        store.list_jobs()
        for suffix in ("", "-wal", "-shm"):
            candidate = Path(f"{database}{suffix}")
            if candidate.exists():
                assert mode(candidate) == 0o600, candidate
        assert mode(database) == 0o600
    finally:
        store.close()
