"""Routes whose JSON bodies are parsed on a worker thread, never on the event loop.

Parsing tens of MiB of JSON takes the loop for as long as it runs, and every call the server
holds (heartbeats, claims, an admin's listing) waits meanwhile. The edge (edge.py) has already
bounded the body by its route's cap; here a body past a few KiB is parsed off the loop.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

INLINE_BYTES = 64 * 1024
"""Below this, a thread hop costs more than the parse it would spare the loop."""


class OffLoopJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            if len(body) <= INLINE_BYTES:
                self._json = json.loads(body)
            else:
                self._json = await run_in_threadpool(json.loads, body)
        return self._json


class OffLoopJSONRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def parsed_off_loop(request: Request) -> Response:
            return await handler(OffLoopJSONRequest(request.scope, request.receive))

        return parsed_off_loop
