"""A real server caps each outputs upload of a worker: how many files, how many bytes once
unpacked, how far they expand past the compressed upload; each checked while the upload
streams in, a 413 naming the limit, and nothing of a refused upload kept."""

from __future__ import annotations

import gzip
import io
import os
import select
import socket
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import httpx
import pytest

from tests.support.servers import ADMIN_TOKEN, ServerProcess

pytestmark = pytest.mark.slow


class Zeros(io.RawIOBase):
    """size zero bytes, made as they are read (a bomb's payload, never in memory whole)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        count = min(len(buffer), self.left)
        buffer[:count] = bytes(count)
        self.left -= count
        return count


def archive(members: list[tuple[str, int, bytes | None]]) -> bytes:
    """A tar.gz of (name, size, content or None for zeros)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, size, content in members:
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, io.BytesIO(content) if content is not None else Zeros(size))
    return buffer.getvalue()


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Any]]:
    server = ServerProcess(
        tmp_path_factory.mktemp("uploads") / "server",
        heartbeat_timeout=600,
        extra_args=("--max-output-files", "100", "--max-output-bytes", "256MiB"),
    ).start()
    admin = httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=120
    )
    join = admin.post("/v1/tokens", json={"kind": "worker"}).json()["token"]
    body = {"name": "up", "capabilities": {"cpu_cores": 1, "memory_gb": 1}}
    registered = httpx.post(
        f"{server.url}/v1/workers", json=body, headers={"Authorization": f"Bearer {join}"}
    ).json()
    worker = httpx.Client(
        base_url=server.url,
        headers={"Authorization": f"Bearer {registered['token']}"},
        timeout=120,
    )
    spec = {
        "workload": {"kind": "command", "command": ["true"]},
        "placement": {"target": "remote", "worker_ids": [registered["worker_id"]]},
    }
    job_id = admin.post("/v1/jobs", json={"spec": spec}).json()["id"]
    (assignment,) = worker.post(f"/v1/workers/{registered['worker_id']}/claim").json()
    try:
        yield server, (admin, worker, job_id, assignment["attempt_id"])
    finally:
        admin.close()
        worker.close()
        server.stop()


def put(plane: tuple[ServerProcess, Any], data: bytes) -> httpx.Response:
    _, (_, worker, _, attempt) = plane
    reply: httpx.Response = worker.put(
        f"/v1/attempts/{attempt}/outputs",
        content=data,
        headers={"Content-Type": "application/octet-stream"},
    )
    return reply


def artifacts(plane: tuple[ServerProcess, Any]) -> list[str]:
    _, (admin, _, job_id, _) = plane
    return [a["path"] for a in admin.get(f"/v1/jobs/{job_id}/artifacts").json()]


def test_too_many_files_are_refused_naming_the_limit(plane: Any) -> None:
    reply = put(plane, archive([(f"f{i}", 0, b"") for i in range(150)]))
    assert reply.status_code == 413, reply.text
    assert "more than 100 files" in reply.json()["error"]
    assert "--max-output-files" in reply.json()["error"]
    assert artifacts(plane) == []


def test_a_gzip_bomb_is_refused_before_it_expands(plane: Any) -> None:
    data = archive([("bomb.bin", 200 * 1024**2, None)])
    assert len(data) < 1024**2  # 200 MiB of zeros, a few hundred KiB on the wire
    reply = put(plane, data)
    assert reply.status_code == 413, reply.text
    assert "--max-output-ratio" in reply.json()["error"]
    assert artifacts(plane) == []
    server, _ = plane
    scratch = [p for p in server.home.rglob("*") if p.is_file() and p.stat().st_size > 1024**2]
    assert scratch == [], scratch  # nothing of it was written out


def test_an_upload_over_the_byte_cap_is_refused_while_it_streams(plane: Any) -> None:
    data = archive([("big.bin", 300 * 1024**2, None)])
    reply = put(plane, data + os.urandom(0))
    assert reply.status_code == 413, reply.text
    assert "--max-output-bytes" in reply.json()["error"]
    assert artifacts(plane) == []


TAIL_BYTES = 96 * 1024**2


@pytest.fixture(scope="module")
def incompressible_tail() -> bytes:
    """The rest of an upload after its offending members: a 96 MiB file of random bytes and the
    archive's end, as a stored (not compressed) gzip member, so the body stays big on the wire."""
    info = tarfile.TarInfo("tail.bin")
    info.size = TAIL_BYTES
    return gzip_member([(info, io.BytesIO(os.urandom(TAIL_BYTES)))], level=0, last=True)


def gzip_member(
    members: list[tuple[tarfile.TarInfo, BinaryIO | None]], *, level: int, last: bool
) -> bytes:
    """These tar members as one gzip member; a gzip file may hold several in a row."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=level, mtime=0) as packed:
        tar = tarfile.TarFile(fileobj=packed, mode="w", format=tarfile.PAX_FORMAT)
        for info, content in members:
            tar.addfile(info, content)
        if last:
            tar.close()  # the end-of-archive blocks
    return buffer.getvalue()


def zeros(name: str, size: int) -> tuple[tarfile.TarInfo, BinaryIO]:
    info = tarfile.TarInfo(name)
    info.size = size
    return info, io.BufferedReader(Zeros(size))


def huge_metadata() -> tuple[tarfile.TarInfo, BinaryIO]:
    """A one-byte file whose pax header carries 100 MiB: nothing a member declares shows it."""
    info = tarfile.TarInfo("small.txt")
    info.size = 1
    info.pax_headers = {"comment": "a" * (100 * 1024**2)}
    return info, io.BytesIO(b"x")


def put_watching(server: ServerProcess, path: str, token: str, body: bytes) -> tuple[int, str, int]:
    """PUT body over a plain socket, looking for the answer before each piece it sends; returns
    the status, the answer's body and how many body bytes were sent when the answer came."""
    head = (
        f"PUT {path} HTTP/1.1\r\nHost: {server.host}:{server.port}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/octet-stream\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((server.host, server.port), timeout=120) as sock:
        sock.sendall(head)
        sock.setblocking(False)
        sent = 0
        while True:
            readable, writable, _ = select.select(
                [sock], [sock] if sent < len(body) else [], [], 120
            )
            if readable:
                break
            assert writable, "the server neither read on nor answered within 120 s"
            try:
                sent += sock.send(body[sent : sent + 64 * 1024])
            except (BrokenPipeError, ConnectionResetError):
                break
        sock.setblocking(True)
        status, text = read_answer(sock)
    return status, text, sent


def read_answer(sock: socket.socket) -> tuple[int, str]:
    received = b""
    while b"\r\n\r\n" not in received:
        piece = sock.recv(65536)
        assert piece, f"the connection closed before an answer: {received!r}"
        received += piece
    head, _, rest = received.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(
        int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")
    )
    while len(rest) < length:
        piece = sock.recv(65536)
        assert piece, "the connection closed inside the answer"
        rest += piece
    return int(lines[0].split()[1]), rest[:length].decode()


@pytest.mark.parametrize(
    ("offending", "named"),
    [
        (
            lambda: [zeros(f"f{i}", 0) for i in range(150)],
            ("more than 100 files", "--max-output-files"),
        ),
        (lambda: [zeros("big.bin", 300 * 1024**2)], ("bytes once unpacked", "--max-output-bytes")),
        (
            lambda: [zeros("bomb.bin", 200 * 1024**2)],
            ("times their compressed", "--max-output-ratio"),
        ),
        (lambda: [huge_metadata()], ("times their compressed", "--max-output-ratio")),
    ],
    ids=["files", "bytes", "ratio", "metadata"],
)
def test_an_upload_over_a_limit_is_refused_while_it_is_still_sent(
    plane: Any, incompressible_tail: bytes, offending: Any, named: tuple[str, str]
) -> None:
    server, (_, worker, _, attempt) = plane
    body = gzip_member(offending(), level=9, last=False) + incompressible_tail
    token = worker.headers["Authorization"].split()[1]
    status, text, sent = put_watching(server, f"/v1/attempts/{attempt}/outputs", token, body)
    assert status == 413, text
    for words in named:
        assert words in text, text
    # The answer came while most of the body was still to be sent: loopback's socket buffers
    # hold a few MiB at most, the body is over 96 MiB.
    assert sent < len(body) // 2, (sent, len(body))
    assert artifacts(plane) == []
    leftovers = [p for p in server.home.rglob("*") if p.is_file() and p.stat().st_size > 1024**2]
    assert leftovers == [], leftovers


def test_outputs_within_the_limits_are_kept(plane: Any) -> None:
    reply = put(plane, archive([("a.txt", 2, b"ok"), ("sub/b.txt", 3, b"yes")]))
    assert reply.status_code == 200, reply.text
    assert sorted(artifacts(plane)) == ["a.txt", "sub/b.txt"]


def test_the_limits_are_checked_at_start(tmp_path: Path) -> None:
    from tests.support.cli import run_cli

    for flags, why in [
        (["--max-output-files", "0"], "--max-output-files: must be at least 1"),
        (["--max-output-bytes", "lots"], "--max-output-bytes:"),
        (["--max-output-ratio", "0.5"], "--max-output-ratio: must be at least 1"),
    ]:
        result = run_cli(["server", "--port", "1", *flags])
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().startswith(f"error: {why}"), result.stderr
