"""The dashboard's routes: login and logout, the pages, their live JSON, log streams.

Every page needs a session cookie opened by logging in with an admin token (or a one-time login
link an admin made); every form posts its session's CSRF token; every answer carries a strict
Content-Security-Policy, so only this package's own script and stylesheet run.
"""

from __future__ import annotations

import asyncio
import json
import mimetypes
from collections.abc import Callable
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlencode

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.responses import StreamingResponse

from gpulayer.control.auth import Principal
from gpulayer.control.service import ControlService
from gpulayer.control.ui import pages
from gpulayer.control.ui.render import render
from gpulayer.control.ui.sessions import (
    LOGIN_CSRF_COOKIE,
    SESSION_COOKIE,
    Session,
    SessionKeeper,
    same_secret,
)
from gpulayer.control.views import log_view
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
_STATIC = {"app.css", "app.js", "favicon.svg"}
_ERROR_STATUS = {NotFoundError: 404, ForbiddenError: 403, StaleAttemptError: 409}
_LOG_RECHECK_SECONDS = 2.0
_SESSION_RECHECK_SECONDS = 30.0

Authenticator = Callable[[str, "str | None"], "Principal | None"]
"""(token, client address) -> its principal; the address keeps slow checks of chosen admin
passwords rationed per client, so one client's wrong logins cannot lock out another's."""


def client_of(request: Request) -> str | None:
    return request.client.host if request.client is not None else None


def _secured(response: Response) -> Response:
    response.headers.update(SECURITY_HEADERS)
    return response


def _html(body: str, status: int = 200) -> Response:
    return _secured(Response(body, status_code=status, media_type="text/html; charset=utf-8"))


def _json(data: Any, status: int = 200) -> Response:
    return _secured(JSONResponse(data, status_code=status))


def _redirect(path: str) -> Response:
    return _secured(RedirectResponse(path, status_code=303))


def _error_status(exc: GpulayerError) -> int:
    return next((code for kind, code in _ERROR_STATUS.items() if isinstance(exc, kind)), 400)


async def _form(request: Request) -> dict[str, str]:
    """An urlencoded form body, last value of each field (no multipart dependency)."""
    body = (await request.body()).decode("utf-8", errors="replace")
    return {k: v[-1] for k, v in parse_qs(body, keep_blank_values=True).items()}


def mount_ui(
    app: FastAPI, service: ControlService, authenticate: Authenticator
) -> Callable[[str], bool]:
    """Returns whether a session cookie is live, for the HTTP edge to ask before it reads a
    form's body."""
    keeper = SessionKeeper(service.store)

    def session_of(request: Request) -> Session | None:
        return keeper.find(request.cookies.get(SESSION_COOKIE))

    def page(request: Request, template: str, session: Session, **context: Any) -> Response:
        return _html(render(template, csrf=session.csrf, path=request.url.path, **context))

    async def checked_post(request: Request) -> tuple[Session, dict[str, str]] | Response:
        """The session and form of a page's POST, or the answer that refuses it."""
        session = await asyncio.to_thread(session_of, request)
        if session is None:
            return _redirect("/ui/login")
        form = await _form(request)
        if not same_secret(form.get("csrf"), session.csrf):
            body = render(
                "error.html",
                csrf=session.csrf,
                path=request.url.path,
                error="CSRF token missing or wrong",
            )
            return _html(body, 403)
        return session, form

    def error_page(request: Request, session: Session, exc: GpulayerError) -> Response:
        status = _error_status(exc)
        body = render("error.html", csrf=session.csrf, path=request.url.path, error=str(exc))
        return _html(body, status)

    def login_page(error: str | None = None, status: int = 200) -> Response:
        import secrets

        pre_csrf = secrets.token_urlsafe(32)
        response = _html(render("login.html", csrf=pre_csrf, error=error), status)
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
        cookie, _session = keeper.open(principal)
        response = _redirect("/ui/jobs")
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
        principal = authenticate(given, client_of(request))
        return principal if principal is not None and principal.kind == "admin" else None

    # --- login, logout --------------------------------------------------------------------

    @app.get("/ui", include_in_schema=False)
    @app.get("/ui/", include_in_schema=False)
    def ui_root(request: Request) -> Response:
        return _redirect("/ui/jobs" if session_of(request) else "/ui/login")

    @app.get("/ui/login", include_in_schema=False)
    def ui_login_form(request: Request) -> Response:
        if session_of(request) is not None:
            return _redirect("/ui/jobs")
        return login_page()

    @app.post("/ui/login", include_in_schema=False)
    async def ui_login(request: Request) -> Response:
        form = await _form(request)
        if not same_secret(form.get("csrf"), request.cookies.get(LOGIN_CSRF_COOKIE) or ""):
            return login_page("the form expired or did not come from this page; try again", 403)
        token = form.get("token", "").strip()
        client = client_of(request)
        principal = await asyncio.to_thread(authenticate, token, client) if token else None
        if principal is None:
            return login_page("wrong, revoked or expired token", 401)
        if principal.kind != "admin":
            return login_page(
                "this token may not open the dashboard: an admin token is needed", 403
            )
        service.touch()
        return await asyncio.to_thread(signed_in, request, principal)

    @app.get("/ui/login/link", include_in_schema=False)
    def ui_login_link(request: Request, code: str = "") -> Response:
        principal = keeper.spend_login_link(code)
        if principal is None:
            return login_page("this login link was used already or has expired", 403)
        service.touch()
        return signed_in(request, principal)

    @app.post("/v1/ui/login-links", include_in_schema=False)
    def ui_new_login_link(request: Request) -> Response:
        creator = bearer_admin(request)
        if creator is None:
            return JSONResponse({"error": "an admin token is needed"}, status_code=401)
        code = keeper.new_login_link(creator)
        return JSONResponse({"path": "/ui/login/link?" + urlencode({"code": code})})

    @app.post("/ui/logout", include_in_schema=False)
    async def ui_logout(request: Request) -> Response:
        session = await asyncio.to_thread(session_of, request)
        form = await _form(request)
        if session is None:
            return _redirect("/ui/login")
        if not same_secret(form.get("csrf"), session.csrf):
            return _html(
                render(
                    "error.html",
                    csrf=session.csrf,
                    path="/ui/logout",
                    error="CSRF token missing or wrong",
                ),
                403,
            )
        await asyncio.to_thread(keeper.close, request.cookies.get(SESSION_COOKIE))
        response = _redirect("/ui/login")
        response.delete_cookie(SESSION_COOKIE, path="/ui")
        return response

    @app.get("/ui/static/{name}", include_in_schema=False)
    def ui_static(name: str) -> Response:
        if name not in _STATIC:
            return _secured(Response("not found", status_code=404))
        data = resources.files("gpulayer.control.ui").joinpath("static").joinpath(name).read_bytes()
        media = mimetypes.guess_type(name)[0] or "application/octet-stream"
        response = _secured(Response(data, media_type=media))
        response.headers["Cache-Control"] = "private, max-age=300"
        return response

    # --- pages ----------------------------------------------------------------------------

    def guarded(build: Callable[[Request, Session], Response]) -> Callable[..., Response]:
        def handler(request: Request) -> Response:
            session = session_of(request)
            if session is None:
                return _redirect("/ui/login")
            service.touch()
            try:
                return build(request, session)
            except GpulayerError as exc:
                return error_page(request, session, exc)

        return handler

    def live(build: Callable[[Request], dict[str, Any]], fragment: str) -> Callable[..., Response]:
        """The JSON a page polls for: its changing part, rendered again."""

        def handler(request: Request) -> Response:
            session = session_of(request)
            if session is None:
                return _json({"error": "not logged in"}, 401)
            try:
                context = build(request)
            except GpulayerError as exc:
                return _json({"error": str(exc)}, _error_status(exc))
            return _json({"html": render(fragment, csrf=session.csrf, **context)})

        return handler

    def jobs_data(request: Request) -> dict[str, Any]:
        filters = pages.parse_job_filters(request.query_params)
        return pages.jobs_context(service, filters)

    def job_data(request: Request) -> dict[str, Any]:
        return pages.job_context(service, request.path_params["job_ref"])

    def workers_data(_request: Request) -> dict[str, Any]:
        return pages.workers_context(service)

    def instances_data(_request: Request) -> dict[str, Any]:
        return pages.instances_context(service)

    def schedules_data(_request: Request) -> dict[str, Any]:
        return pages.schedules_context(service)

    def jobs_page(request: Request, session: Session) -> Response:
        context = jobs_data(request)
        poll = "/ui/api/jobs?" + urlencode(dict(request.query_params))
        return page(request, "jobs.html", session, poll=poll, **context)

    def job_page(request: Request, session: Session) -> Response:
        context = job_data(request)
        job_id = context["job"]["id"]
        return page(request, "job.html", session, poll=f"/ui/api/jobs/{job_id}", **context)

    def workers_page(request: Request, session: Session) -> Response:
        return page(
            request,
            "workers.html",
            session,
            poll="/ui/api/workers",
            chart=pages.gpu_hours_chart(service),
            **workers_data(request),
        )

    def instances_page(request: Request, session: Session) -> Response:
        return page(
            request,
            "instances.html",
            session,
            poll="/ui/api/instances",
            chart=pages.spend_chart(service),
            **instances_data(request),
        )

    def schedules_page(request: Request, session: Session) -> Response:
        return page(
            request,
            "schedules.html",
            session,
            poll="/ui/api/schedules",
            **schedules_data(request),
        )

    def offers_page(request: Request, session: Session) -> Response:
        query = dict(request.query_params)
        try:
            context = pages.offers_context(service, query)
        except GpulayerError as exc:
            body = render(
                "offers.html",
                csrf=session.csrf,
                path=request.url.path,
                listing=None,
                query=query,
                error=str(exc),
            )
            return _html(body, 400)
        return page(request, "offers.html", session, error=None, **context)

    routes: list[tuple[str, Callable[[Request, Session], Response]]] = [
        ("/ui/jobs", jobs_page),
        ("/ui/jobs/{job_ref}", job_page),
        ("/ui/workers", workers_page),
        ("/ui/instances", instances_page),
        ("/ui/schedules", schedules_page),
        ("/ui/offers", offers_page),
    ]
    for path, build in routes:
        app.add_api_route(path, guarded(build), methods=["GET"], include_in_schema=False)
    feeds: list[tuple[str, Callable[[Request], dict[str, Any]], str]] = [
        ("/ui/api/jobs", jobs_data, "_jobs_table.html"),
        ("/ui/api/jobs/{job_ref}", job_data, "_job_live.html"),
        ("/ui/api/workers", workers_data, "_workers_table.html"),
        ("/ui/api/instances", instances_data, "_instances_table.html"),
        ("/ui/api/schedules", schedules_data, "_schedules_table.html"),
    ]
    for path, data, fragment in feeds:
        app.add_api_route(path, live(data, fragment), methods=["GET"], include_in_schema=False)

    @app.post("/ui/jobs/{job_ref}/cancel", include_in_schema=False)
    async def ui_cancel(job_ref: str, request: Request) -> Response:
        checked = await checked_post(request)
        if isinstance(checked, Response):
            return checked
        session, _ = checked
        service.touch()
        try:
            job = await asyncio.to_thread(service.cancel, job_ref)
        except GpulayerError as exc:
            return error_page(request, session, exc)
        return _redirect(f"/ui/jobs/{job.id}")

    @app.post("/ui/offers/plan", include_in_schema=False)
    async def ui_plan(request: Request) -> Response:
        checked = await checked_post(request)
        if isinstance(checked, Response):
            return checked
        session, form = checked
        service.touch()
        text = form.get("spec", "")
        shown: dict[str, Any] = {
            "csrf": session.csrf,
            "path": "/ui/offers",
            "listing": None,
            "query": {},
        }
        try:
            context = await asyncio.to_thread(pages.plan_context, service, text)
        except GpulayerError as exc:
            body = render("offers.html", **shown, spec_text=text, plan_error=str(exc))
            return _html(body, 400)
        return _html(render("offers.html", **shown, spec_text=text, error=None, **context))

    @app.get("/ui/jobs/{job_ref}/artifacts/{path:path}", include_in_schema=False)
    def ui_artifact(job_ref: str, path: str, request: Request) -> Response:
        session = session_of(request)
        if session is None:
            return _redirect("/ui/login")
        try:
            file = service.artifact_path(job_ref, path)
        except GpulayerError as exc:
            return error_page(request, session, exc)
        return _secured(FileResponse(file, filename=file.name))

    @app.get("/ui/api/jobs/{job_ref}/logs", include_in_schema=False)
    async def ui_log_stream(job_ref: str, request: Request, after: int = 0) -> Response:
        """Server-sent events: each log line once, in order; `end` when the job has ended."""
        session = await asyncio.to_thread(session_of, request)
        if session is None:
            return _json({"error": "not logged in"}, 401)
        try:
            job_id = await asyncio.to_thread(service.resolve_job_id, job_ref)
        except GpulayerError as exc:
            return _json({"error": str(exc)}, _error_status(exc))
        resume = request.headers.get("last-event-id", "")
        start = int(resume) if resume.isdigit() else max(0, after)
        cookie = request.cookies.get(SESSION_COOKIE)
        return _secured(
            StreamingResponse(
                _log_events(service, keeper, cookie, job_id, start),
                media_type="text/event-stream",
                headers={"X-Accel-Buffering": "no"},
            )
        )

    return lambda cookie: keeper.find(cookie) is not None


async def _log_events(
    service: ControlService, keeper: SessionKeeper, cookie: str | None, job_id: str, after: int
) -> Any:
    # Read the store only when the service says something changed (or every couple of
    # seconds, for writers in another server process), so idle streams cost next to nothing.
    loop = asyncio.get_running_loop()
    seen = -1
    last_read = 0.0
    session_checked = loop.time()
    yield "retry: 2000\n\n"
    while True:
        now = loop.time()
        if now - session_checked > _SESSION_RECHECK_SECONDS:
            session_checked = now
            if await asyncio.to_thread(keeper.find, cookie) is None:
                yield "event: logout\ndata: {}\n\n"
                return
        if service.version != seen or now - last_read >= _LOG_RECHECK_SECONDS:
            seen = service.version
            last_read = now
            lines, job = await asyncio.to_thread(service.read_logs, job_id, after=after)
            for line in lines:
                after = line.id
                yield f"id: {line.id}\ndata: {json.dumps(log_view(line))}\n\n"
            if lines:
                continue
            if job.terminal:
                yield f"event: end\ndata: {json.dumps({'state': job.state})}\n\n"
                return
        await asyncio.sleep(0.2)
