"""A control plane that dies mid-answer: the client sees it out of reach, as callers expect,
never half a file or a raw http.client error."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer.errors import ControlPlaneError
from gpulayer.protocol.client import ControlClient


class CutOffServer:
    """Answers every request with ``head`` then ``body``, then closes the connection."""

    def __init__(self, head: bytes, body: bytes, *, stall: bool = False) -> None:
        self.answer = head + body
        self.stall = stall  # keep the connection open, silent, after the answer's start
        self._release = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.requests = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    data = conn.recv(4096)
                    if not data:
                        break
                    request += data
                self.requests += 1
                conn.sendall(self.answer)
                if self.stall:
                    self._release.wait(30)

    def close(self) -> None:
        self._release.set()
        # close() alone leaves a thread blocked in accept(); shutdown wakes it.
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self._thread.join(timeout=5)


@pytest.fixture
def cut_off() -> Iterator[type[CutOffServer]]:
    servers: list[CutOffServer] = []

    class Tracked(CutOffServer):
        def __init__(self, head: bytes, body: bytes, *, stall: bool = False) -> None:
            super().__init__(head, body, stall=stall)
            servers.append(self)

    yield Tracked
    for server in servers:
        server.close()


def _client(server: CutOffServer) -> ControlClient:
    return ControlClient(f"http://127.0.0.1:{server.port}", "token", timeout=5)


SHORT = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 100000\r\n\r\n"
)
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_a_download_cut_short_is_out_of_reach_and_leaves_no_file(
    cut_off: type[CutOffServer], tmp_path: Path
) -> None:
    server = cut_off(SHORT, b"x" * 1000)
    destination = tmp_path / "source.tar.gz"
    with pytest.raises(ControlPlaneError, match="broke off its answer to GET"):
        _client(server).download("/v1/jobs/j/bundle", destination)
    assert server.requests == 1
    assert not destination.exists()


def test_a_chunked_download_cut_off_is_out_of_reach(
    cut_off: type[CutOffServer], tmp_path: Path
) -> None:
    server = cut_off(CHUNKED, b"400\r\n" + b"y" * 10)
    destination = tmp_path / "out.bin"
    with pytest.raises(ControlPlaneError):
        _client(server).download("/v1/jobs/j/artifacts/out.bin", destination)
    assert not destination.exists()


def test_a_whole_download_is_kept(cut_off: type[CutOffServer], tmp_path: Path) -> None:
    body = bytes(range(256)) * 300
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    destination = tmp_path / "whole.bin"
    _client(cut_off(head, body)).download("/v1/x", destination)
    assert destination.read_bytes() == body


def test_a_json_answer_cut_short_is_out_of_reach(cut_off: type[CutOffServer]) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n"
    server = cut_off(head, b'{"id": "j-1", "sta')
    with pytest.raises(ControlPlaneError, match="broke off its answer to GET /v1/jobs"):
        _client(server).request("GET", "/v1/jobs")


def test_an_answer_that_stops_midway_is_out_of_reach_after_the_timeout(
    cut_off: type[CutOffServer], tmp_path: Path
) -> None:
    server = cut_off(SHORT, b"z" * 10, stall=True)
    client = ControlClient(f"http://127.0.0.1:{server.port}", "token", timeout=0.5)
    with pytest.raises(ControlPlaneError, match="did not finish its answer to GET /v1/x in time"):
        client.download("/v1/x", tmp_path / "x.bin")
    assert not (tmp_path / "x.bin").exists()
