"""moto's AWS server with a thin WSGI layer in front, run as its own process by the tests.

The layer adds what moto lacks and tests need, all under ``/_gpulayer/``:

- faults: answer an EC2 action with a queued error (capacity, quota, auth), optionally only
  for requests whose parameters match, for a number of times or until reset;
- a Pricing API stand-in: GetProducts answered from a product list the test sets;
- a call log of EC2 actions, so tests can tell which calls a provider made.

Usage: python moto_app.py  (prints the port it listens on, on 127.0.0.1, then serves)
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import threading
from typing import Any
from urllib.parse import parse_qs
from xml.sax.saxutils import escape

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import make_server

StartResponse = Any


class TestLayer:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.lock = threading.Lock()
        self.faults: list[dict[str, Any]] = []
        self.products: list[dict[str, Any]] | None = None
        self.calls: list[dict[str, str]] = []

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Any:
        path = environ.get("PATH_INFO", "")
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        # moto reads the body again; without this it waits for bytes that never come.
        environ["wsgi.input"] = io.BytesIO(body)
        if path.startswith("/_gpulayer/"):
            return self.control(path, body, start_response)
        # EC2 speaks the query protocol (Action in a form body); Pricing speaks JSON with the
        # action in a header.
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        if target:
            params = {"Action": target.rsplit(".", 1)[-1]}
        else:
            params = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
        action = params.get("Action")
        if action:
            with self.lock:
                self.calls.append(params)
                fault = self.take_fault(action, params)
            if fault is not None:
                return self.error(fault, start_response, json_protocol=bool(target))
        if action == "GetProducts" and self.products is not None:
            return self.get_products(body, start_response)
        return self.app(environ, start_response)

    def take_fault(self, action: str, params: dict[str, str]) -> dict[str, Any] | None:
        for fault in self.faults:
            if fault["action"] not in (action, "*"):
                continue
            if any(params.get(k) != v for k, v in fault.get("match", {}).items()):
                continue
            times = fault.get("times")
            if times is not None:
                if times <= 0:
                    continue
                fault["times"] = times - 1
            return fault
        return None

    def error(
        self, fault: dict[str, Any], start_response: StartResponse, *, json_protocol: bool
    ) -> list[bytes]:
        status = int(fault.get("status", 400))
        message = fault.get("message", fault["code"])
        if json_protocol:
            start_response(f"{status} Error", [("Content-Type", "application/x-amz-json-1.1")])
            return [json.dumps({"__type": fault["code"], "message": message}).encode()]
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?>'
            f"<Response><Errors><Error><Code>{escape(fault['code'])}</Code>"
            f"<Message>{escape(message)}</Message></Error></Errors>"
            "<RequestID>gpulayer-test</RequestID></Response>"
        ).encode()
        start_response(f"{status} Error", [("Content-Type", "text/xml")])
        return [xml]

    def get_products(self, body: bytes, start_response: StartResponse) -> list[bytes]:
        request = json.loads(body or b"{}")
        wanted = {f["Field"]: f["Value"] for f in request.get("Filters", [])}
        selected = []
        for product in self.products or []:
            attributes = product.get("product", {}).get("attributes", {})
            if all(attributes.get(k) == v for k, v in wanted.items() if k in attributes):
                selected.append(json.dumps(product))
        answer = json.dumps({"FormatVersion": "aws_v1", "PriceList": selected}).encode()
        start_response("200 OK", [("Content-Type", "application/x-amz-json-1.1")])
        return [answer]

    def control(self, path: str, body: bytes, start_response: StartResponse) -> list[bytes]:
        data = json.loads(body) if body else {}
        answer: Any = {"ok": True}
        with self.lock:
            if path == "/_gpulayer/faults":
                self.faults.append(data)
            elif path == "/_gpulayer/products":
                self.products = data["products"]
            elif path == "/_gpulayer/calls":
                answer = self.calls
            elif path == "/_gpulayer/reset":
                self.faults, self.products, self.calls = [], None, []
            else:
                start_response("404 Not Found", [("Content-Type", "text/plain")])
                return [b"unknown control path"]
        start_response("200 OK", [("Content-Type", "application/json")])
        return [json.dumps(answer).encode()]


def main() -> None:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    app = TestLayer(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, app, threaded=True)
    # Nothing here needs flushing, and open keep-alive connections would delay a normal exit.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    print(server.server_port, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
