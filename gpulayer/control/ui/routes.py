"""The dashboard: login and logout, the pages, their live JSON, log streams.

Every page needs a session cookie opened by logging in with an admin token (or a one-time login
link an admin made); every form posts its session's CSRF token; every answer carries a strict
Content-Security-Policy, so only this package's own script and stylesheet run. The routes live
in one router per concern (login_routes, page_routes, log_stream) over what web.py shares.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute

from gpulayer.control.schedule_service import ScheduleService
from gpulayer.control.service import ControlService
from gpulayer.control.ui import log_stream, login_routes, page_routes
from gpulayer.control.ui.sessions import SessionKeeper
from gpulayer.control.ui.web import (
    SECURITY_HEADERS,
    Authenticator,
    UiContext,
    client_of,
    install_ui_context,
)

__all__ = ["SECURITY_HEADERS", "client_of", "mount_ui"]

ROUTERS = [login_routes.router, page_routes.router, log_stream.router]


def mount_ui(
    app: FastAPI,
    service: ControlService,
    authenticate: Authenticator,
    schedules: ScheduleService | None = None,
) -> Callable[[str], bool]:
    """Returns whether a session cookie is live, for the HTTP edge to ask before it reads a
    form's body."""
    keeper = SessionKeeper(service.store)
    install_ui_context(app, UiContext(service, authenticate, keeper, schedules))
    for router in ROUTERS:
        _add_route_by_route(app, router)
    return lambda cookie: keeper.find(cookie) is not None


def _add_route_by_route(app: FastAPI, router: APIRouter) -> None:
    # Not include_router: FastAPI keeps an included router as one opaque entry of app.routes,
    # and the dashboard's routes (which the OpenAPI document leaves out) are found there.
    for route in router.routes:
        assert isinstance(route, APIRoute)
        app.add_api_route(
            route.path,
            route.endpoint,
            methods=sorted(route.methods or ()),
            name=route.name,
            include_in_schema=False,
        )
