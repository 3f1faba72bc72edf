"""Each of the control plane's routers serves on a bare app of its own, given the context its
dependencies read: nothing a router needs is built inside create_app."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulayer.control.paths import HomeLayout
from gpulayer.control.service import ControlService
from gpulayer.control.store import Store

ADMIN = "routers-admin-token-0123456789"
JOB = {
    "workload": {"kind": "command", "command": ["true"]},
    "placement": {"target": "remote", "worker_labels": {"pool": "none"}},
}


@pytest.fixture()
def service(tmp_path: Path) -> Iterator[ControlService]:
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    yield ControlService(store, HomeLayout(tmp_path / "home").ensure())
    store.close()


def bare_app(service: ControlService, *routers: Any) -> Any:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from gpulayer.control.api import single_token
    from gpulayer.control.routes.deps import ApiContext, install_context

    app = FastAPI()
    install_context(app, ApiContext(service, single_token(ADMIN)))
    for router in routers:
        app.include_router(router)
    return TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False)


def test_the_jobs_routers_alone_submit_list_and_refuse_a_missing_token(
    service: ControlService,
) -> None:
    from gpulayer.control.routes import jobs, submit

    client = bare_app(service, submit.router, jobs.router)
    auth = {"authorization": f"Bearer {ADMIN}"}
    made = client.post("/v1/jobs", json={"spec": JOB}, headers=auth)
    assert made.status_code == 201, made.text
    listed = client.get("/v1/jobs", headers=auth)
    assert [job["id"] for job in listed.json()] == [made.json()["id"]]
    refused = client.get("/v1/jobs")
    assert refused.status_code == 401
    assert "token" in refused.json()["error"]


def test_the_tokens_router_alone_creates_a_token_it_then_lists(service: ControlService) -> None:
    from gpulayer.control.routes import tokens

    client = bare_app(service, tokens.router)
    auth = {"authorization": f"Bearer {ADMIN}"}
    made = client.post("/v1/tokens", json={"kind": "join", "name": "lab"}, headers=auth)
    assert made.status_code == 200, made.text
    assert made.json()["kind"] == "join"
    assert [t["name"] for t in client.get("/v1/tokens", headers=auth).json()] == ["lab"]


def test_the_dashboard_routers_alone_answer_with_their_security_headers(
    service: ControlService,
) -> None:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from gpulayer.control.api import single_token
    from gpulayer.control.ui.routes import SECURITY_HEADERS, mount_ui

    app = FastAPI()
    mount_ui(app, service, single_token(ADMIN))
    client = TestClient(app, base_url="http://127.0.0.1")
    page = client.get("/ui/jobs", follow_redirects=False)
    assert page.status_code == 303 and page.headers["location"] == "/ui/login"
    login = client.get("/ui/login")
    assert login.status_code == 200
    for name, value in SECURITY_HEADERS.items():
        assert login.headers[name] == value
