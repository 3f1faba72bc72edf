"""The HTTP edge: an ASGI middleware in front of every route of the control plane.

It enforces the API client boundary before any route runs: a request that carries a body is
only read once its caller is known from its headers (a bearer token, or a dashboard session for
the dashboard's forms; only the login form is open), and never past its route's cap (see
body_caps). Refusals are one line: 401 for an unknown caller, 413 naming the cap. A JSON body is
buffered whole within its cap and handed to the route as it came; an upload streams through,
counted. A write that finds the server's disk full is answered 507 in one line rather than
cutting the connection. It also keeps the server's progress clock beating (see progress.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.requests import cookie_parser
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpulayer.control.body_caps import BodyTooLarge, CapRule, refusal_line, rule_for
from gpulayer.control.disk_full import DISK_FULL_LINE, is_disk_full
from gpulayer.control.progress import BEAT_SECONDS, ServerProgress

log = logging.getLogger("gpulayer.edge")

UNAUTHORIZED_LINE = "missing, wrong, revoked or expired token"
SESSION_COOKIE = "gpulayer_session"


class _Disconnected(Exception):
    """The client went away while its body was being read: nothing to answer."""


class RequestEdge:
    def __init__(
        self,
        app: ASGIApp,
        *,
        authenticate: Callable[..., Any],
        caps: tuple[CapRule, ...],
        ui_session: Callable[[str], bool] | None = None,
        progress: ServerProgress | None = None,
    ) -> None:
        self.app = app
        self._authenticate = authenticate
        self._caps = caps
        self._ui_session = ui_session
        self._progress = progress
        self._beat_loop: asyncio.AbstractEventLoop | None = None
        self._beater: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self._keep_beating()
        method, path = scope["method"], scope["path"]
        headers = Headers(scope=scope)
        length = _content_length(headers)
        has_body = "transfer-encoding" in headers or (length or 0) > 0
        app_receive = receive
        if has_body:
            rule = rule_for(self._caps, method, path)
            refusal = await self._gate(rule, headers, scope)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
            if length is not None and length > rule.cap:
                await _too_large(rule, method, path)(scope, receive, send)
                return
            if rule.streamed:
                app_receive = _counted(receive, rule, method, path)
            else:
                try:
                    body = await _read_within(receive, rule.cap)
                except _Disconnected:
                    return
                if body is None:
                    await _too_large(rule, method, path)(scope, receive, send)
                    return
                app_receive = _replayed(body, receive)
        await self._run(scope, app_receive, send)

    async def _run(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except BodyTooLarge as exc:
            if started:
                raise
            await _one_line(str(exc), 413)(scope, receive, send)
        except Exception as exc:
            if started or not is_disk_full(exc):
                raise
            log.warning("%s %s: the disk is full (%s)", scope["method"], scope["path"], exc)
            await _one_line(DISK_FULL_LINE, 507)(scope, receive, send)

    async def _gate(self, rule: CapRule, headers: Headers, scope: Scope) -> Response | None:
        """The answer that refuses this caller before its body is read; None lets it in."""
        if rule.gate == "open":
            return None
        if rule.gate == "session":
            cookie = cookie_parser(headers.get("cookie", "")).get(SESSION_COOKIE)
            known = self._ui_session is not None and bool(cookie)
            if known and await run_in_threadpool(self._ui_session, cookie):  # type: ignore[arg-type]
                return None
            return RedirectResponse("/ui/login", status_code=303)
        scheme, _, given = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and given:
            client = scope.get("client")
            host = client[0] if client else None
            if await run_in_threadpool(self._authenticate, given, host) is not None:
                return None
        return _one_line(UNAUTHORIZED_LINE, 401)

    def _keep_beating(self) -> None:
        """The progress clock beats on the loop that serves calls, through the thread pool
        that runs heartbeats: a stall of either is a stall of the server."""
        if self._progress is None:
            return
        loop = asyncio.get_running_loop()
        if self._beat_loop is loop and self._beater is not None and not self._beater.done():
            return
        self._beat_loop = loop
        self._beater = loop.create_task(_beat(self._progress))


async def _beat(progress: ServerProgress) -> None:
    while True:
        await run_in_threadpool(progress.beat)
        await asyncio.sleep(BEAT_SECONDS)


def _content_length(headers: Headers) -> int | None:
    value = headers.get("content-length")
    return int(value) if value is not None and value.isdigit() else None


async def _read_within(receive: Receive, cap: int) -> bytes | None:
    """The whole body, or None as soon as it passes ``cap`` (the rest is left unread)."""
    chunks: list[bytes] = []
    total = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        total += len(chunk)
        if total > cap:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replayed(body: bytes, receive: Receive) -> Receive:
    handed = False

    async def replay() -> Message:
        nonlocal handed
        if not handed:
            handed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # what follows the body: the client's disconnect

    return replay


def _counted(receive: Receive, rule: CapRule, method: str, path: str) -> Receive:
    received = 0

    async def counted() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > rule.cap:
                raise BodyTooLarge(rule, method, path)
        return message

    return counted


def _too_large(rule: CapRule, method: str, path: str) -> Response:
    return _one_line(refusal_line(rule, method, path), 413)


def _one_line(line: str, status: int) -> Response:
    return JSONResponse({"error": line}, status_code=status)
