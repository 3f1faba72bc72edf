"""What the dashboard's routers share: the app's dashboard context, sessions, and answers that
carry the strict security headers."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from gpulayer.control.auth import Principal
from gpulayer.control.schedule_service import ScheduleService
from gpulayer.control.service import ControlService
from gpulayer.control.ui.render import render
from gpulayer.control.ui.sessions import (
    LOGIN_CSRF_COOKIE,
    SESSION_COOKIE,
    Session,
    SessionKeeper,
    same_secret,
)
from gpulayer.errors import ForbiddenError, GpulayerError, NotFoundError, StaleAttemptError

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_ERROR_STATUS = {NotFoundError: 404, ForbiddenError: 403, StaleAttemptError: 409}

Authenticator = Callable[[str, "str | None"], "Principal | None"]
"""(token, client address) -> its principal; the address keeps slow checks of chosen admin
passwords rationed per client, so one client's wrong logins cannot lock out another's."""


@dataclass
class UiContext:
    """What the dashboard's routes of one app serve from; kept on ``app.state.ui``."""

    service: ControlService
    authenticate: Authenticator
    keeper: SessionKeeper
    schedules: ScheduleService | None = None


def install_ui_context(app: FastAPI, context: UiContext) -> None:
    app.state.ui = context


def ui_of(request: Request) -> UiContext:
    context: UiContext = request.app.state.ui
    return context


def client_of(request: Request) -> str | None:
    return request.client.host if request.client is not None else None


def session_of(request: Request) -> Session | None:
    return ui_of(request).keeper.find(request.cookies.get(SESSION_COOKIE))


def secured(response: Response) -> Response:
    response.headers.update(SECURITY_HEADERS)
    return response


def html(body: str, status: int = 200) -> Response:
    return secured(Response(body, status_code=status, media_type="text/html; charset=utf-8"))


def json_answer(data: Any, status: int = 200) -> Response:
    return secured(JSONResponse(data, status_code=status))


def redirect(path: str) -> Response:
    return secured(RedirectResponse(path, status_code=303))


def error_status(exc: GpulayerError) -> int:
    return next((code for kind, code in _ERROR_STATUS.items() if isinstance(exc, kind)), 400)


async def form_of(request: Request) -> dict[str, str]:
    """An urlencoded form body, last value of each field (no multipart dependency)."""
    body = (await request.body()).decode("utf-8", errors="replace")
    return {k: v[-1] for k, v in parse_qs(body, keep_blank_values=True).items()}


def page(request: Request, template: str, session: Session, **context: Any) -> Response:
    return html(render(template, csrf=session.csrf, path=request.url.path, **context))


def error_page(request: Request, session: Session, exc: GpulayerError) -> Response:
    body = render("error.html", csrf=session.csrf, path=request.url.path, error=str(exc))
    return html(body, error_status(exc))


def csrf_refused(session: Session, path: str) -> Response:
    body = render("error.html", csrf=session.csrf, path=path, error="CSRF token missing or wrong")
    return html(body, 403)


async def checked_post(request: Request) -> tuple[Session, dict[str, str]] | Response:
    """The session and form of a page's POST, or the answer that refuses it."""
    session = await asyncio.to_thread(session_of, request)
    if session is None:
        return redirect("/ui/login")
    form = await form_of(request)
    if not same_secret(form.get("csrf"), session.csrf):
        return csrf_refused(session, request.url.path)
    return session, form


def login_page(error: str | None = None, status: int = 200) -> Response:
    pre_csrf = secrets.token_urlsafe(32)
    response = html(render("login.html", csrf=pre_csrf, error=error), status)
    response.set_cookie(
        LOGIN_CSRF_COOKIE,
        pre_csrf,
        max_age=1800,
        httponly=True,
        samesite="strict",
        path="/ui/login",
    )
    return response


def signed_in(request: Request, principal: Principal) -> Response:
    keeper = ui_of(request).keeper
    cookie, _session = keeper.open(principal)
    response = redirect("/ui/jobs")
    response.set_cookie(
        SESSION_COOKIE,
        cookie,
        max_age=int(keeper.lifetime),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/ui",
    )
    response.delete_cookie(LOGIN_CSRF_COOKIE, path="/ui/login")
    return response


def bearer_admin(request: Request) -> Principal | None:
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        return None
    principal = ui_of(request).authenticate(given, client_of(request))
    return principal if principal is not None and principal.kind == "admin" else None
