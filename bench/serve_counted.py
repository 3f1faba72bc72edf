"""`gpulayer server` with a count of the HTTP requests it answered, for bench/throughput.py.

    python bench/serve_counted.py COUNT_FILE server --host ... --port ...

Wraps the app that ``create_app`` returns in an ASGI layer that counts requests and writes the
count to COUNT_FILE every 0.1 s (and the count by route to COUNT_FILE.routes.json), then runs the gpulayer CLI with the remaining arguments. It
changes nothing else, so it measures any checkout's server the same way.
"""

from __future__ import annotations

import json
import re
import runpy
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any


def main() -> None:
    count_file = Path(sys.argv[1])
    sys.argv = ["gpulayer", *sys.argv[2:]]
    from gpulayer.control import api

    original = api.create_app
    counted = [0]
    by_route: Counter[str] = Counter()

    def create_app(*args: Any, **kwargs: Any) -> Any:
        app = original(*args, **kwargs)

        async def counting(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                counted[0] += 1
                by_route[f"{scope['method']} {_route(scope['path'])}"] += 1
            await app(scope, receive, send)

        return counting

    api.create_app = create_app  # type: ignore[assignment]

    def write() -> None:
        stop = threading.Event()
        while not stop.wait(0.1):
            count_file.write_text(str(counted[0]))
            routes = count_file.with_name(count_file.name + ".routes.json")
            routes.write_text(json.dumps(dict(by_route)))

    threading.Thread(target=write, daemon=True).start()
    runpy.run_module("gpulayer", run_name="__main__")


def _route(path: str) -> str:
    """The path with its ids folded, so that one route is one count."""
    return re.sub(r"/(?:\d+|[0-9a-f]{8,}|[a-z]+-[0-9a-z]{6,})(?=/|$)", "/{id}", path)


if __name__ == "__main__":
    main()
