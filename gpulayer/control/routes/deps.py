"""What every router shares: the app's context, who is calling, and the input checks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi import Path as PathParam

from gpulayer.control.arrays import ARRAY_ID
from gpulayer.control.auth import Principal
from gpulayer.control.idempotency import HEADER as IDEMPOTENCY_HEADER
from gpulayer.control.idempotency import Answers, request_key
from gpulayer.control.schedule_service import ScheduleService
from gpulayer.control.service import ControlService
from gpulayer.control.store.once_keys import OnceKey
from gpulayer.control.text_checks import unsafe_text
from gpulayer.errors import SpecError
from gpulayer.spec.models import MAX_NODES

Authenticator = Callable[..., "Principal | None"]
"""(token, client address=None) -> its principal, or None when unknown, revoked or expired."""

MAX_WAIT_SECONDS = 30.0
# The store's id columns are INTEGER: 32 bits in PostgreSQL, so that is the largest id.
ID_MAX = 2**31 - 1


@dataclass
class ApiContext:
    """What the routes of one app serve from; kept on ``app.state.control``."""

    service: ControlService
    authenticate: Authenticator
    embedded: bool = False
    schedules: ScheduleService | None = None
    answers: Answers = field(init=False)

    def __post_init__(self) -> None:
        self.answers = Answers(self.service.store)


class Unauthorized(Exception):
    """No token, or one the control plane does not know: answered 401 (see install_context)."""


def install_context(app: FastAPI, context: ApiContext) -> None:
    """Make ``context`` the one the routers' dependencies find, and answer a refused token."""
    from fastapi.responses import JSONResponse

    app.state.control = context

    @app.exception_handler(Unauthorized)
    async def _unauthorized(_request: Request, exc: Unauthorized) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=401)


async def _context(request: Request) -> ApiContext:
    # async: a dependency this cheap must not cost a thread hop per request.
    context: ApiContext = request.app.state.control
    return context


Context = Annotated[ApiContext, Depends(_context)]


def caller(request: Request) -> Principal:
    context: ApiContext = request.app.state.control
    context.service.touch()
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    client = request.client.host if request.client is not None else None
    principal = (
        context.authenticate(given, client) if scheme.lower() == "bearer" and given else None
    )
    if principal is None:
        raise Unauthorized("missing, wrong, revoked or expired token")
    return principal


def admin_only(request: Request) -> None:
    if caller(request).kind != "admin":
        raise Unauthorized("this token may only run a worker")


async def storable_text(request: Request) -> None:
    """Refuse, naming the field, strings that no store can hold (see text_checks)."""
    problems = unsafe_text(dict(request.path_params)) + unsafe_text(dict(request.query_params))
    if request.headers.get("content-type", "").startswith("application/json"):
        try:
            body = await request.json()
        except Exception:
            body = None  # the route's own parsing answers for a body that is not JSON
        problems += await asyncio.to_thread(unsafe_text, body)  # bodies run to MiBs
    if problems:
        raise SpecError(problems)


async def once_key(request: Request) -> OnceKey | None:
    """The create request's Idempotency-Key, bound to its caller and its body's sha256."""
    raw = request.headers.get(IDEMPOTENCY_HEADER)
    if raw is None:
        return None
    who = await asyncio.to_thread(caller, request)
    return request_key(who, raw, request.method, request.url.path, await request.body())


Caller = Annotated[Principal, Depends(caller)]
CHECKED = Depends(storable_text)
ADMIN: list[Any] = [Depends(admin_only), CHECKED]
"""An admin's route whose input is checked: the dependencies of most routes."""

# Every number a route takes fits the store's columns: a bigger one is the caller's mistake
# (422), not the database driver's overflow (500).
RowId = Annotated[int, PathParam(ge=0, le=ID_MAX)]
Cursor = Annotated[int, Query(ge=0, le=ID_MAX)]
Limit = Annotated[int, Query(ge=1, le=10_000)]
WaitSeconds = Annotated[float, Query(ge=0, allow_inf_nan=False)]
NodeRank = Annotated[int | None, Query(ge=0, le=MAX_NODES - 1)]
ArrayId = Annotated[str, PathParam(pattern=f"^{ARRAY_ID.pattern}$")]

# Routes that take a file rather than JSON say so in the OpenAPI document.
ARCHIVE_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}
