"""The dashboard's pages, the live JSON each polls for, and its forms (cancel, plan) and files."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, Response

from gpulayer.control.json_route import OffLoopJSONRoute
from gpulayer.control.ui import pages
from gpulayer.control.ui.render import render
from gpulayer.control.ui.sessions import Session
from gpulayer.control.ui.web import (
    checked_post,
    error_page,
    error_status,
    html,
    json_answer,
    page,
    redirect,
    secured,
    session_of,
    ui_of,
)
from gpulayer.errors import GpulayerError

router = APIRouter(route_class=OffLoopJSONRoute, include_in_schema=False)


def guarded(build: Callable[[Request, Session], Response]) -> Callable[..., Response]:
    def handler(request: Request) -> Response:
        session = session_of(request)
        if session is None:
            return redirect("/ui/login")
        ui_of(request).service.touch()
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
            return json_answer({"error": "not logged in"}, 401)
        try:
            context = build(request)
        except GpulayerError as exc:
            return json_answer({"error": str(exc)}, error_status(exc))
        return json_answer({"html": render(fragment, csrf=session.csrf, **context)})

    return handler


def jobs_data(request: Request) -> dict[str, Any]:
    filters = pages.parse_job_filters(request.query_params)
    return pages.jobs_context(ui_of(request).service, filters)


def job_data(request: Request) -> dict[str, Any]:
    return pages.job_context(ui_of(request).service, request.path_params["job_ref"])


def workers_data(request: Request) -> dict[str, Any]:
    return pages.workers_context(ui_of(request).service)


def instances_data(request: Request) -> dict[str, Any]:
    return pages.instances_context(ui_of(request).service)


def schedules_data(request: Request) -> dict[str, Any]:
    return pages.schedules_context(ui_of(request).schedules)


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
        chart=pages.gpu_hours_chart(ui_of(request).service),
        **workers_data(request),
    )


def instances_page(request: Request, session: Session) -> Response:
    return page(
        request,
        "instances.html",
        session,
        poll="/ui/api/instances",
        chart=pages.spend_chart(ui_of(request).service),
        **instances_data(request),
    )


def schedules_page(request: Request, session: Session) -> Response:
    return page(
        request, "schedules.html", session, poll="/ui/api/schedules", **schedules_data(request)
    )


def offers_page(request: Request, session: Session) -> Response:
    query = dict(request.query_params)
    try:
        context = pages.offers_context(ui_of(request).service, query)
    except GpulayerError as exc:
        body = render(
            "offers.html",
            csrf=session.csrf,
            path=request.url.path,
            listing=None,
            query=query,
            error=str(exc),
        )
        return html(body, 400)
    return page(request, "offers.html", session, error=None, **context)


_PAGES: list[tuple[str, Callable[[Request, Session], Response]]] = [
    ("/ui/jobs", jobs_page),
    ("/ui/jobs/{job_ref}", job_page),
    ("/ui/workers", workers_page),
    ("/ui/instances", instances_page),
    ("/ui/schedules", schedules_page),
    ("/ui/offers", offers_page),
]
for _path, _build in _PAGES:
    router.add_api_route(_path, guarded(_build), methods=["GET"])
_FEEDS: list[tuple[str, Callable[[Request], dict[str, Any]], str]] = [
    ("/ui/api/jobs", jobs_data, "_jobs_table.html"),
    ("/ui/api/jobs/{job_ref}", job_data, "_job_live.html"),
    ("/ui/api/workers", workers_data, "_workers_table.html"),
    ("/ui/api/instances", instances_data, "_instances_table.html"),
    ("/ui/api/schedules", schedules_data, "_schedules_table.html"),
]
for _path, _data, _fragment in _FEEDS:
    router.add_api_route(_path, live(_data, _fragment), methods=["GET"])


@router.post("/ui/jobs/{job_ref}/cancel")
async def ui_cancel(job_ref: str, request: Request) -> Response:
    checked = await checked_post(request)
    if isinstance(checked, Response):
        return checked
    session, _ = checked
    service = ui_of(request).service
    service.touch()
    try:
        job = await asyncio.to_thread(service.jobs.cancel, job_ref)
    except GpulayerError as exc:
        return error_page(request, session, exc)
    return redirect(f"/ui/jobs/{job.id}")


@router.post("/ui/offers/plan")
async def ui_plan(request: Request) -> Response:
    checked = await checked_post(request)
    if isinstance(checked, Response):
        return checked
    session, form = checked
    service = ui_of(request).service
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
        return html(body, 400)
    return html(render("offers.html", **shown, spec_text=text, error=None, **context))


@router.get("/ui/jobs/{job_ref}/artifacts/{path:path}")
def ui_artifact(job_ref: str, path: str, request: Request) -> Response:
    session = session_of(request)
    if session is None:
        return redirect("/ui/login")
    try:
        file = ui_of(request).service.jobs.artifact_path(job_ref, path)
    except GpulayerError as exc:
        return error_page(request, session, exc)
    return secured(FileResponse(file, filename=file.name))
