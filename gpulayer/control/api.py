"""The control plane's HTTP API (FastAPI). Thin: parse, call the service, shape the answer."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from gpulayer import __version__
from gpulayer.control.auth import LOCAL_ADMIN, Principal
from gpulayer.control.body_caps import route_caps
from gpulayer.control.edge import RequestEdge
from gpulayer.control.idempotency import TokenShownOnce
from gpulayer.control.json_route import OffLoopJSONRoute
from gpulayer.control.output_uploads import UploadTooLarge
from gpulayer.control.routes import (
    attach,
    attempts,
    bundles,
    cloud,
    health,
    jobs,
    schedules,
    secrets,
    submit,
    tokens,
    workers,
)
from gpulayer.control.routes.deps import ADMIN, ApiContext, Authenticator, install_context
from gpulayer.control.schedule_service import ScheduleService
from gpulayer.control.service import ControlService
from gpulayer.control.text_checks import repaired
from gpulayer.errors import (
    ForbiddenError,
    GpulayerError,
    NotFoundError,
    SpecError,
    StaleAttemptError,
    UsageError,
)

log = logging.getLogger("gpulayer.api")

__all__ = ["Authenticator", "SafeJSONResponse", "create_app", "single_token"]

_STATUS: dict[type[GpulayerError], int] = {
    NotFoundError: 404,
    ForbiddenError: 403,
    StaleAttemptError: 409,
    UsageError: 400,
    UploadTooLarge: 413,
    TokenShownOnce: 409,
}

# In the order their routes were first written: where two paths could match one request, the
# earlier one answers.
ROUTERS = [
    health.router,
    submit.router,
    jobs.router,
    workers.router,
    attempts.router,
    tokens.router,
    cloud.router,
    schedules.router,
    bundles.router,
    secrets.router,
    attach.router,
]


class SafeJSONResponse(JSONResponse):
    """A JSON answer that renders whatever a row holds: text a client cannot decode or a NaN
    stored before input was checked is repaired rather than failing the whole listing."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except (UnicodeEncodeError, ValueError):
            return super().render(repaired(content))


def single_token(token: str) -> Authenticator:
    expected = token.encode()

    def check(given: str, _client: str | None = None) -> Principal | None:
        return LOCAL_ADMIN if hmac.compare_digest(given.encode(), expected) else None

    return check


def create_app(
    service: ControlService,
    authenticate: Authenticator,
    *,
    embedded: bool = False,
    extra_routes: Callable[[FastAPI, list[Any]], None] | None = None,
    schedules: ScheduleService | None = None,
) -> FastAPI:
    """``extra_routes(app, admin_auth)`` adds the embedded daemon's own routes; without
    ``schedules`` the schedule routes answer that this control plane runs none."""
    app = FastAPI(
        title="gpulayer control plane",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        default_response_class=SafeJSONResponse,
    )
    app.router.route_class = OffLoopJSONRoute  # before any route is added
    install_context(app, ApiContext(service, authenticate, embedded, schedules))
    _install_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    if extra_routes is not None:
        extra_routes(app, ADMIN)

    from gpulayer.control.ui import mount_ui

    ui_session = mount_ui(app, service, authenticate, schedules)
    app.add_middleware(
        RequestEdge,
        authenticate=authenticate,
        caps=route_caps(service.output_limits.max_bytes),
        ui_session=ui_session,
        progress=service.progress,
    )
    return app


def _field_line(error: Any) -> str:
    where = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
    return f"{where or 'request'}: {error.get('msg', 'invalid')}"


def _install_error_handlers(app: FastAPI) -> None:
    """One strategy for every route: the caller's mistakes are 4xx naming the field; only a
    fault of the control plane itself is a 500, logged here and answered in one line."""

    def refused(errors: list[Any], status: int = 422) -> JSONResponse:
        lines = [_field_line(e) for e in errors] or ["request: invalid"]
        detail = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "")} for e in errors]
        return SafeJSONResponse(
            {"error": "; ".join(lines), "detail": repaired(detail)}, status_code=status
        )

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return refused(list(exc.errors()))

    @app.exception_handler(ValidationError)
    async def _model_invalid(_request: Request, exc: ValidationError) -> JSONResponse:
        return refused(list(exc.errors()))

    @app.exception_handler(GpulayerError)
    async def _typed_error(_request: Request, exc: GpulayerError) -> JSONResponse:
        if isinstance(exc, SpecError):
            return SafeJSONResponse({"error": str(exc), "errors": exc.lines}, status_code=422)
        status = next((code for kind, code in _STATUS.items() if isinstance(exc, kind)), 500)
        return SafeJSONResponse({"error": str(exc), "kind": type(exc).__name__}, status_code=status)

    @app.exception_handler(OverflowError)
    async def _overflow(_request: Request, exc: OverflowError) -> JSONResponse:
        return SafeJSONResponse({"error": f"a number is out of range: {exc}"}, status_code=400)

    @app.exception_handler(RecursionError)
    async def _too_deep(_request: Request, _exc: RecursionError) -> JSONResponse:
        return SafeJSONResponse({"error": "request: nested too deeply"}, status_code=400)

    from sqlalchemy.exc import DataError

    @app.exception_handler(DataError)
    async def _out_of_range(_request: Request, exc: DataError) -> JSONResponse:
        # A value the database's column types refuse: the caller's, as the store says.
        first = str(exc.orig).strip().splitlines()[0] if exc.orig else "invalid value"
        return SafeJSONResponse(
            {"error": f"a value is out of range for the store: {first}"}, status_code=400
        )

    @app.exception_handler(Exception)
    async def _fault(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return SafeJSONResponse({"error": f"internal error: {type(exc).__name__}"}, status_code=500)
