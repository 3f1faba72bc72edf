"""The dashboard's doors: its root, login (by token or one-time link), logout, static files."""

from __future__ import annotations

import asyncio
import mimetypes
from importlib import resources
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gpulayer.control.json_route import OffLoopJSONRoute
from gpulayer.control.ui.sessions import LOGIN_CSRF_COOKIE, SESSION_COOKIE, same_secret
from gpulayer.control.ui.web import (
    bearer_admin,
    client_of,
    csrf_refused,
    form_of,
    login_page,
    redirect,
    secured,
    session_of,
    signed_in,
    ui_of,
)

router = APIRouter(route_class=OffLoopJSONRoute, include_in_schema=False)

_STATIC = {"app.css", "app.js", "favicon.svg"}


@router.get("/ui")
@router.get("/ui/")
def ui_root(request: Request) -> Response:
    return redirect("/ui/jobs" if session_of(request) else "/ui/login")


@router.get("/ui/login")
def ui_login_form(request: Request) -> Response:
    if session_of(request) is not None:
        return redirect("/ui/jobs")
    return login_page()


@router.post("/ui/login")
async def ui_login(request: Request) -> Response:
    form = await form_of(request)
    if not same_secret(form.get("csrf"), request.cookies.get(LOGIN_CSRF_COOKIE) or ""):
        return login_page("the form expired or did not come from this page; try again", 403)
    token = form.get("token", "").strip()
    client = client_of(request)
    ui = ui_of(request)
    principal = await asyncio.to_thread(ui.authenticate, token, client) if token else None
    if principal is None:
        return login_page("wrong, revoked or expired token", 401)
    if principal.kind != "admin":
        return login_page("this token may not open the dashboard: an admin token is needed", 403)
    ui.service.touch()
    return await asyncio.to_thread(signed_in, request, principal)


@router.get("/ui/login/link")
def ui_login_link(request: Request, code: str = "") -> Response:
    ui = ui_of(request)
    principal = ui.keeper.spend_login_link(code)
    if principal is None:
        return login_page("this login link was used already or has expired", 403)
    ui.service.touch()
    return signed_in(request, principal)


@router.post("/v1/ui/login-links")
def ui_new_login_link(request: Request) -> Response:
    creator = bearer_admin(request)
    if creator is None:
        return JSONResponse({"error": "an admin token is needed"}, status_code=401)
    code = ui_of(request).keeper.new_login_link(creator)
    return JSONResponse({"path": "/ui/login/link?" + urlencode({"code": code})})


@router.post("/ui/logout")
async def ui_logout(request: Request) -> Response:
    session = await asyncio.to_thread(session_of, request)
    form = await form_of(request)
    if session is None:
        return redirect("/ui/login")
    if not same_secret(form.get("csrf"), session.csrf):
        return csrf_refused(session, "/ui/logout")
    await asyncio.to_thread(ui_of(request).keeper.close, request.cookies.get(SESSION_COOKIE))
    response = redirect("/ui/login")
    response.delete_cookie(SESSION_COOKIE, path="/ui")
    return response


@router.get("/ui/static/{name}")
def ui_static(name: str) -> Response:
    if name not in _STATIC:
        return secured(Response("not found", status_code=404))
    data = resources.files("gpulayer.control.ui").joinpath("static").joinpath(name).read_bytes()
    media = mimetypes.guess_type(name)[0] or "application/octet-stream"
    response = secured(Response(data, media_type=media))
    response.headers["Cache-Control"] = "private, max-age=300"
    return response
