"""A server whose disk fills answers 507 in one line and stores nothing half (a real server
process whose home is a small tmpfs the test mounts; needs root)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.body_flood import MIB, send
from tests.support.servers import ADMIN_TOKEN, ServerProcess

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root"),
]

_SIZE = 48 * MIB


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={_SIZE}", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


@pytest.fixture
def server(small_disk: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(small_disk / "server").start()
    try:
        yield process
    finally:
        process.stop()


def _free(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def _leftovers(home: Path) -> list[Path]:
    found = []
    for folder in ("incoming", "bundles"):
        if (home / folder).is_dir():
            found += [p for p in (home / folder).rglob("*") if p.is_file()]
    return found


def test_an_upload_that_fills_the_disk_is_507_and_nothing_is_kept(
    server: ServerProcess, small_disk: Path
) -> None:
    body = os.urandom(_free(small_disk) + 8 * MIB)  # more than there is room for
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}",
               "Content-Type": "application/octet-stream"}  # fmt: skip
    sent = send(server.host, server.port, "PUT", "/v1/bundles", body, headers)
    assert sent.status == 507, sent
    error = json.loads(sent.body)["error"]
    assert "disk is full" in error and "\n" not in error, error
    assert _leftovers(server.home) == []
    # The server goes on: its room came back with the upload's file gone.
    assert _free(small_disk) > 8 * MIB
    client = server.client()
    assert client.health()["ok"] is True
    job = client.submit({"workload": {"kind": "command", "command": ["true"]}})
    assert client.job(job["id"])["state"] == "queued"


def test_a_write_to_a_full_store_is_507(server: ServerProcess, small_disk: Path) -> None:
    client = server.client()
    filler = small_disk / "filler"
    with filler.open("wb") as out:
        try:
            while True:
                out.write(b"\0" * MIB)
                out.flush()
        except OSError:
            pass
    try:
        spec = {"workload": {"kind": "command", "command": ["echo", "x" * 200_000]}}
        status = []
        for _ in range(20):  # until SQLite has no free page left to write into
            sent = send(server.host, server.port, "POST", "/v1/jobs", json.dumps({"spec": spec}).encode(),
                        {"Authorization": f"Bearer {ADMIN_TOKEN}",
                         "Content-Type": "application/json"})  # fmt: skip
            status.append(sent.status)
            if sent.status != 201:
                break
        assert status[-1] == 507, status
        assert "disk is full" in json.loads(sent.body)["error"]
    finally:
        filler.unlink()
    assert client.jobs(limit=100) is not None  # still answering once room is back
