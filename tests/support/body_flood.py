"""Big request bodies sent to a real server over a raw socket, and the server's memory read
from /proc: what an unauthenticated client can make a server hold."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

MIB = 1024 * 1024


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """A process's resident memory (VmRSS) or its peak so far (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise LookupError(f"{field} not in /proc/{pid}/status")


def json_body(size: int, shape: str = "string") -> bytes:
    """A valid JSON submit body of about ``size`` bytes: one long string in the spec, or
    ("objects") a list of small objects, which a parser turns into many times its size."""
    if shape == "objects":
        head, item, tail = b'{"spec": {"env": [', b'{"a":1},', b'{"a":1}]}}'
        return head + item * max(0, (size - len(head) - len(tail)) // len(item)) + tail
    head, tail = b'{"spec": {"name": "', b'"}}'
    return head + b"a" * max(0, size - len(head) - len(tail)) + tail


@dataclass
class Sent:
    status: int
    body: bytes
    answered_s: float
    """From the request's first byte until its status line came back."""
    sent_bytes: int
    """How much of the body had gone out when the answer came (or the writer stopped)."""


def send(
    host: str,
    port: int,
    method: str,
    path: str,
    body: bytes,
    headers: dict[str, str] | None = None,
    *,
    chunked: bool = False,
    timeout: float = 120.0,
    whole: bool = False,
) -> Sent:
    """Write ``body`` on one thread while the answer is read on this one, so a server that
    answers before reading the body is seen to (the answer arrives while bytes still go out).
    ``whole``: go on sending the rest after the answer, as a client that ignores it would."""
    sock = socket.create_connection((host, port), timeout=timeout)
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}"]
    for key, value in (headers or {}).items():
        lines.append(f"{key}: {value}")
    lines.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}")
    sent = [0]

    def write() -> None:
        step = 256 * 1024
        try:
            for start in range(0, len(body), step):
                piece = body[start : start + step]
                if chunked:
                    piece = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
                sock.sendall(piece)
                sent[0] += min(step, len(body) - start)
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the server closed its side: what it answered is what counts

    started = time.monotonic()
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        response = http.client.HTTPResponse(sock)
        response.begin()
        answered = time.monotonic() - started
        at_answer = sent[0]
        data = response.read()
        if whole:
            writer.join(timeout=timeout)
        return Sent(response.status, data, answered, at_answer)
    finally:
        sock.close()
        writer.join(timeout=timeout)


def timed_call(host: str, port: int, token: str, path: str = "/v1/jobs?limit=1") -> float:
    """Seconds one small admin GET takes."""
    conn = http.client.HTTPConnection(host, port, timeout=300)
    try:
        started = time.monotonic()
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise AssertionError(f"GET {path}: {response.status}")
        return time.monotonic() - started
    finally:
        conn.close()
