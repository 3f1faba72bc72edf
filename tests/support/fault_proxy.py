"""An HTTP proxy on loopback that loses chosen replies: the reply never reaches the client.

Stands between a worker and its control plane to reproduce a claim whose reply was lost on
the way (the control plane thinks it handed the job over; the worker never heard of it).
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LosePredicate = Callable[[str, str, bytes], bool]
"""(method, path, upstream reply body) -> lose this reply?"""


class LossyProxy:
    def __init__(self, upstream_port: int, lose: LosePredicate) -> None:
        self.lost: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args: object) -> None:
                pass

            def _forward(self) -> None:
                body = self._body()
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in ("host", "transfer-encoding", "content-length")
                }
                if body is not None:
                    headers["Content-Length"] = str(len(body))
                upstream = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=120)
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    reply = upstream.getresponse()
                    data = reply.read()
                finally:
                    upstream.close()
                if proxy._should_lose(self.command, self.path, data):
                    self.close_connection = True  # no reply at all: the connection just ends
                    return
                self.send_response(reply.status)
                for key, value in reply.getheaders():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> bytes | None:
                if self.headers.get("transfer-encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        chunk = self.rfile.read(size)
                        self.rfile.readline()
                        if size == 0:
                            return b"".join(chunks)
                        chunks.append(chunk)
                length = int(self.headers.get("content-length") or 0)
                return self.rfile.read(length) if length else None

            do_GET = do_POST = do_PUT = do_DELETE = _forward

        self._lose = lose
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _should_lose(self, method: str, path: str, body: bytes) -> bool:
        with self._lock:
            if self._lose(method, path, body):
                self.lost.append(f"{method} {path}")
                return True
        return False

    def start(self) -> LossyProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
