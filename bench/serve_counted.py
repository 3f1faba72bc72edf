"""`gpulayer server` with a count of the HTTP requests it answered, for bench/throughput.py.

    python bench/serve_counted.py COUNT_FILE server --host ... --port ...

Wraps the app that ``create_app`` returns in an ASGI layer that counts requests and writes the
count to COUNT_FILE every 0.1 s, then runs the gpulayer CLI with the remaining arguments. It
changes nothing else, so it measures any checkout's server the same way.
"""

from __future__ import annotations

import runpy
import sys
import threading
from pathlib import Path
from typing import Any


def main() -> None:
    count_file = Path(sys.argv[1])
    sys.argv = ["gpulayer", *sys.argv[2:]]
    from gpulayer.control import api

    original = api.create_app
    counted = [0]

    def create_app(*args: Any, **kwargs: Any) -> Any:
        app = original(*args, **kwargs)

        async def counting(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                counted[0] += 1
            await app(scope, receive, send)

        return counting

    api.create_app = create_app  # type: ignore[assignment]

    def write() -> None:
        stop = threading.Event()
        while not stop.wait(0.1):
            count_file.write_text(str(counted[0]))

    threading.Thread(target=write, daemon=True).start()
    runpy.run_module("gpulayer", run_name="__main__")


if __name__ == "__main__":
    main()
