"""The dashboard's security over plain HTTP, against the real app and a real SQLite store:
CSRF tokens on forms, server-side sessions that logout ends, single-use login links, headers."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulayer.control.auth import TokenAuthority, issue_token, keep_chosen_token
from gpulayer.control.paths import HomeLayout
from gpulayer.control.service import ControlService
from gpulayer.control.store import Store

ADMIN = "dashboard-admin-token-0123456789"
SLEEPER = {
    "workload": {"kind": "command", "command": ["sleep", "60"]},
    "placement": {"target": "remote", "worker_labels": {"pool": "none"}},
}


@pytest.fixture()
def plane(tmp_path: Path) -> Iterator[tuple[Any, ControlService]]:
    from fastapi.testclient import TestClient

    from gpulayer.control.api import create_app

    layout = HomeLayout(tmp_path / "home").ensure()
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    service = ControlService(store, layout)
    app = create_app(service, TokenAuthority(store, local_admin_token=ADMIN), embedded=False)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield client, service
    store.close()


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "the page has no CSRF field"
    return found.group(1)


def log_in(client: Any, token: str = ADMIN) -> Any:
    form = client.get("/ui/login")
    return client.post(
        "/ui/login", data={"csrf": csrf_of(form.text), "token": token}, follow_redirects=False
    )


def queued_job(service: ControlService) -> str:
    service.store.upsert_worker(
        worker_id="w-remote", name="remote", kind="remote", labels={}, capabilities={"cpu_cores": 1}
    )
    return service.submissions.submit(SLEEPER).id


def test_cancel_without_or_with_a_wrong_csrf_token_is_refused(plane: Any) -> None:
    client, service = plane
    assert log_in(client).status_code == 303
    job_id = queued_job(service)
    page = client.get(f"/ui/jobs/{job_id}")
    assert 'id="cancel-form"' in page.text
    refused = client.post(f"/ui/jobs/{job_id}/cancel", data={}, follow_redirects=False)
    assert refused.status_code == 403
    wrong = client.post(
        f"/ui/jobs/{job_id}/cancel", data={"csrf": "x" * 43}, follow_redirects=False
    )
    assert wrong.status_code == 403
    assert service.store.get_job(job_id).state != "cancelled"
    done = client.post(
        f"/ui/jobs/{job_id}/cancel", data={"csrf": csrf_of(page.text)}, follow_redirects=False
    )
    assert done.status_code == 303
    assert service.store.get_job(job_id).state == "cancelled"


def test_every_form_on_every_page_that_posts_carries_the_csrf_token(plane: Any) -> None:
    client, service = plane
    log_in(client)
    job_id = queued_job(service)
    for path in (
        "/ui/jobs",
        f"/ui/jobs/{job_id}",
        "/ui/workers",
        "/ui/instances",
        "/ui/schedules",
        "/ui/offers",
    ):
        html = client.get(path).text
        forms = re.findall(r"<form[^>]*method=\"post\".*?</form>", html, flags=re.S)
        assert forms, path
        for form in forms:
            assert 'name="csrf"' in form, (path, form)


def test_login_form_needs_its_own_csrf_token(plane: Any) -> None:
    client, _ = plane
    client.get("/ui/login")
    refused = client.post("/ui/login", data={"token": ADMIN}, follow_redirects=False)
    assert refused.status_code == 403
    assert "gpulayer_session" not in refused.headers.get("set-cookie", "")


def test_session_cookie_flags_and_server_side_logout(plane: Any) -> None:
    client, service = plane
    answer = log_in(client)
    cookie = answer.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Max-Age=" in cookie
    value = client.cookies.get("gpulayer_session")
    assert value and ADMIN not in cookie
    # Only the cookie's hash is kept; the row has its expiry.
    with service.store.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT id_hash, expires_at FROM ui_sessions").all()
    assert len(rows) == 1 and rows[0][0] != value and rows[0][1] > time.time()
    page = client.get("/ui/jobs")
    assert page.status_code == 200
    out = client.post("/ui/logout", data={"csrf": csrf_of(page.text)}, follow_redirects=False)
    assert out.status_code == 303
    # The same cookie, replayed, opens nothing: the session ended on the server.
    client.cookies.set("gpulayer_session", value)
    again = client.get("/ui/jobs", follow_redirects=False)
    assert again.status_code == 303 and again.headers["location"] == "/ui/login"
    assert client.get("/ui/api/jobs").status_code == 401


def test_a_revoked_admin_token_ends_its_sessions(plane: Any) -> None:
    client, service = plane
    token, record = issue_token(service.store, "admin", "ui")
    assert log_in(client, token).status_code == 303
    assert client.get("/ui/jobs", follow_redirects=False).status_code == 200
    service.store.revoke_token(record.id)
    assert client.get("/ui/jobs", follow_redirects=False).status_code == 303


def test_worker_and_join_tokens_cannot_log_in_or_make_links(plane: Any) -> None:
    client, service = plane
    join, _ = issue_token(service.store, "join", "j")
    worker, _ = issue_token(service.store, "worker", "w", worker_id="w1")
    for token in (join, worker):
        refused = log_in(client, token)
        assert refused.status_code == 403
        assert "gpulayer_session" not in refused.headers.get("set-cookie", "")
        link = client.post("/v1/ui/login-links", headers={"Authorization": f"Bearer {token}"})
        assert link.status_code == 401
    assert log_in(client, "wrong").status_code == 401


@pytest.mark.parametrize("way_in", ["login form", "bearer"])
def test_a_flood_of_wrong_logins_from_one_client_leaves_another_clients_login(
    tmp_path: Path, way_in: str
) -> None:
    """A chosen admin password is checked by scrypt a few times a minute per client: one client
    guessing spends its own allowance, not the dashboard's."""
    from fastapi.testclient import TestClient

    from gpulayer.control.api import create_app

    chosen = "a password someone chose for the dashboard"
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    keep_chosen_token(store, chosen, "admin", "dashboard")
    service = ControlService(store, HomeLayout(tmp_path / "home").ensure())
    authority = TokenAuthority(store, slow_checks_per_minute=3)
    app = create_app(service, authority, embedded=False)

    def from_address(host: str) -> Any:
        return TestClient(app, base_url="http://127.0.0.1", client=(host, 50000))

    with from_address("10.0.0.1") as guesser, from_address("10.0.0.2") as owner:
        for i in range(10):
            assert log_in(guesser, f"guess {i}").status_code == 401
            wrong = {"Authorization": f"Bearer bearer guess {i}"}
            assert guesser.post("/v1/ui/login-links", headers=wrong).status_code == 401
        assert authority.slow_checks == 3  # the guesser's allowance, spent
        if way_in == "login form":
            assert log_in(owner, chosen).status_code == 303
        else:
            right = {"Authorization": f"Bearer {chosen}"}
            assert owner.post("/v1/ui/login-links", headers=right).status_code == 200
    store.close()


def test_a_login_link_is_spent_once_even_when_raced(plane: Any) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from fastapi.testclient import TestClient

    client, _ = plane
    made = client.post("/v1/ui/login-links", headers={"Authorization": f"Bearer {ADMIN}"})
    path = made.json()["path"]

    def use(_: int) -> int:
        with TestClient(client.app, base_url="http://127.0.0.1") as other:
            return int(other.get(path, follow_redirects=False).status_code)

    with ThreadPoolExecutor(8) as pool:
        codes = sorted(pool.map(use, range(8)))
    assert codes == [303] + [403] * 7


def test_pages_carry_a_strict_content_security_policy(plane: Any) -> None:
    client, _ = plane
    log_in(client)
    for path in ("/ui/login", "/ui/jobs", "/ui/api/jobs", "/ui/static/app.js"):
        headers = client.get(path).headers
        policy = headers["content-security-policy"]
        assert "default-src 'none'" in policy and "script-src 'self'" in policy
        assert "unsafe-inline" not in policy
        assert headers["x-content-type-options"] == "nosniff"
    html = client.get("/ui/jobs").text
    assert "<script>" not in html and " onclick=" not in html and " style=" not in html


def test_bad_filters_name_the_field(plane: Any) -> None:
    client, _ = plane
    log_in(client)
    for query, field in (("state=nope", "state"), ("label=novalue", "label"), ("page=0", "page")):
        answer = client.get(f"/ui/jobs?{query}")
        assert answer.status_code == 400 and f"{field}:" in answer.text
    assert client.get("/ui/jobs/j-doesnotexist").status_code == 404
    offers = client.get("/ui/offers?gpus=two")
    assert offers.status_code == 400 and "gpus:" in offers.text


def test_instances_page_shows_the_ledger_and_the_spend_chart(plane: Any) -> None:
    client, service = plane
    log_in(client)
    job_id = queued_job(service)
    now = time.time()
    service.store.record_instance(
        request_id="req-ui-1",
        job_id=job_id,
        owner="me",
        provider="aws",
        region="us-east-1",
        instance_type="g5.xlarge",
        instance_id="i-0abc",
        state="running",
        hourly_price=1.5,
        created_at=now - 7300,
        launched_at=now - 7200,
        ready_at=now - 7000,
    )
    page = client.get("/ui/instances").text
    assert "i-0abc" in page and "g5.xlarge" in page and "1.5000 USD" in page
    accrued = re.search(r"(\d+\.\d{4}) USD</td>\s*</tr>", page)
    assert accrued and float(accrued.group(1)) == pytest.approx(3.0, abs=0.01)  # 2 h at 1.5/h
    assert re.search(r"<rect [^>]*><title>\d{4}-\d\d-\d\d aws: ", page), "no spend bar for aws"
    job_page = client.get(f"/ui/jobs/{job_id}").text
    assert 'id="phases"' in job_page and "booting" in job_page and "in use (now)" in job_page
    assert 'class="phase phase-provisioning"' in job_page


@pytest.mark.slow
def test_the_team_server_serves_the_dashboard_and_logs_no_token(tmp_path: Path) -> None:
    import httpx

    from tests.support.servers import ADMIN_TOKEN, ServerProcess

    server = ServerProcess(tmp_path / "server-home").start()
    try:
        with httpx.Client(base_url=server.url, timeout=30, follow_redirects=True) as client:
            form = client.get("/ui/login")
            assert form.status_code == 200
            answer = client.post(
                "/ui/login", data={"csrf": csrf_of(form.text), "token": ADMIN_TOKEN}
            )
            assert answer.status_code == 200 and 'id="jobs"' in answer.text
            assert str(answer.url).endswith("/ui/jobs") and ADMIN_TOKEN not in str(answer.url)
            link = client.post(
                "/v1/ui/login-links", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
            )
            assert link.status_code == 200 and link.json()["path"].startswith("/ui/login/link?")
    finally:
        server.stop()
    assert ADMIN_TOKEN not in (server.home / "server.log").read_text()


def test_artifacts_download_from_the_job_page_and_nothing_outside_them(plane: Any) -> None:
    client, service = plane
    log_in(client)
    job_id = queued_job(service)
    service.jobs.cancel(job_id)
    outputs = service.layout.outputs_dir(job_id)
    (outputs / "out").mkdir(parents=True)
    (outputs / "out" / "a b.txt").write_text("weights\n")
    service.store.record_artifacts(job_id, [("out/a b.txt", 8, "0" * 64)])
    page = client.get(f"/ui/jobs/{job_id}").text
    href = re.search(r'href="(/ui/jobs/[^"]+/artifacts/[^"]+)"', page)
    assert href, "no artifact link"
    download = client.get(href.group(1))
    assert download.status_code == 200 and download.text == "weights\n"
    assert "attachment" in download.headers["content-disposition"]
    escape = client.get(f"/ui/jobs/{job_id}/artifacts/..%2F..%2F..%2Fstate.db")
    assert escape.status_code == 404
    client.cookies.clear()
    assert client.get(href.group(1), follow_redirects=False).status_code == 303


def test_offers_page_lists_region_and_zone_apart_and_on_demand_prices(plane: Any) -> None:
    client, _ = plane
    log_in(client)
    html = client.get("/ui/offers?gpu=A100&provider=aws").text
    header = re.search(r"<thead>(.*?)</thead>", html, flags=re.S)
    assert header and "<th>Region</th><th>Zone</th>" in header.group(1)
    # aws with its default settings rents on-demand only: no spot rows, no Spot column.
    assert "<th>Spot</th>" not in header.group(1)
    assert "p4d.24xlarge" in html


def test_offers_page_plans_a_pasted_spec_and_creates_nothing(plane: Any) -> None:
    client, service = plane
    log_in(client)
    service.store.upsert_worker(
        worker_id="w-small", name="small", kind="remote", labels={}, capabilities={"cpu_cores": 2}
    )
    service.store.upsert_worker(
        worker_id="w-big", name="big", kind="remote", labels={}, capabilities={"cpu_cores": 64}
    )
    page = client.get("/ui/offers")
    assert 'id="plan-form"' in page.text
    spec = (
        "workload: {kind: command, command: [python, train.py]}\n"
        "resources: {cpu_cores: 8}\nplacement: {target: remote}\n"
    )
    refused = client.post("/ui/offers/plan", data={"spec": spec}, follow_redirects=False)
    assert refused.status_code == 403
    planned = client.post("/ui/offers/plan", data={"csrf": csrf_of(page.text), "spec": spec})
    assert planned.status_code == 200, planned.text
    html = planned.text
    # w-big fits; w-small is turned down, and counted under its reason.
    assert "plan: the job would run on remote worker w-big (big)" in html
    assert 'data-outcome="chosen"' in html and 'data-worker="w-big"' in html
    assert 'data-worker="w-small"' not in html
    assert "1 worker turned down: needs 8 CPU cores, has 2" in html
    assert service.store.list_jobs(limit=10) == []

    broken = client.post(
        "/ui/offers/plan", data={"csrf": csrf_of(page.text), "spec": "workload: [unclosed"}
    )
    assert broken.status_code == 400 and 'id="plan-error"' in broken.text
    assert "spec: " in broken.text and "--file" not in broken.text
    invalid = client.post(
        "/ui/offers/plan",
        data={"csrf": csrf_of(page.text), "spec": "workload: {kind: command, command: []}"},
    )
    assert invalid.status_code == 400 and "workload.command" in invalid.text
    assert service.store.list_jobs(limit=10) == []


def test_an_idle_machine_shows_its_time_left_on_the_dashboard_and_in_the_api(
    tmp_path: Path,
) -> None:
    """The time left is read from providers.yaml's idle_seconds as the lifecycle reads it."""
    from fastapi.testclient import TestClient

    from gpulayer.control.api import create_app
    from gpulayer.control.cloud_attach import ProviderCloud

    layout = HomeLayout(tmp_path / "home").ensure()
    (layout.root / "providers.yaml").write_text("gpulayer:\n  idle_seconds: 90\n")
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    service = ControlService(store, layout, cloud=ProviderCloud(layout.root, store))
    app = create_app(service, TokenAuthority(store, local_admin_token=ADMIN), embedded=False)
    try:
        with TestClient(app, base_url="http://127.0.0.1") as client:
            log_in(client)
            job_id = queued_job(service)
            now = time.time()
            store.record_instance(
                request_id="req-idle-1",
                job_id=job_id,
                owner="me",
                provider="aws",
                region="us-east-1",
                instance_type="g5.xlarge",
                instance_id="i-0idle",
                state="idle",
                state_since=now - 30,
                hourly_price=1.0,
                created_at=now - 600,
                launched_at=now - 590,
            )
            page = client.get("/ui/instances").text
            left = re.search(r"idle \((\d+) s left\)", page)
            assert left and 55 <= int(left.group(1)) <= 60, page
            headers = {"Authorization": f"Bearer {ADMIN}"}
            (view,) = client.get("/v1/instances", headers=headers).json()
            assert (
                view["state_label"].startswith("idle (") and 55 <= view["idle_seconds_left"] <= 60
            )
    finally:
        store.close()


def test_a_fleets_idle_machines_show_kept_or_their_time_left_on_the_dashboard_and_in_the_api(
    tmp_path: Path,
) -> None:
    """Of a fleet's idle machines, those within min_nodes are kept (no time left), the others
    show their fleet's idle_seconds left, as the lifecycle reads them; each shows its fleet."""
    from fastapi.testclient import TestClient

    from gpulayer.control.api import create_app
    from gpulayer.control.cloud_attach import ProviderCloud

    layout = HomeLayout(tmp_path / "home").ensure()
    (layout.root / "providers.yaml").write_text(
        "fleets:\n  - {name: train, min_nodes: 1, max_nodes: 2, idle_seconds: 90}\n"
    )
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    service = ControlService(store, layout, cloud=ProviderCloud(layout.root, store))
    app = create_app(service, TokenAuthority(store, local_admin_token=ADMIN), embedded=False)
    try:
        with TestClient(app, base_url="http://127.0.0.1") as client:
            log_in(client)
            now = time.time()
            for request_id, idle_for in (("req-kept", 300), ("req-above", 30)):
                store.record_instance(
                    request_id=request_id,
                    job_id="",  # a fleet's machine no job took
                    fleet="train",
                    owner="me",
                    provider="aws",
                    region="us-east-1",
                    instance_type="g5.xlarge",
                    instance_id=f"i-{request_id}",
                    state="idle",
                    state_since=now - idle_for,
                    hourly_price=1.0,
                    created_at=now - 600,
                    launched_at=now - 590,
                )
            page = client.get("/ui/instances").text
            assert "idle (kept: min_nodes)" in page and "train" in page
            left = re.search(r"idle \((\d+) s left\)", page)
            assert left and 55 <= int(left.group(1)) <= 60, page
            headers = {"Authorization": f"Bearer {ADMIN}"}
            views = {
                v["request_id"]: v for v in client.get("/v1/instances", headers=headers).json()
            }
            kept, above = views["req-kept"], views["req-above"]
            assert kept["idle_kept"] and kept["idle_seconds_left"] is None
            assert kept["job_id"] is None and kept["fleet"] == "train"
            assert not above["idle_kept"] and 55 <= above["idle_seconds_left"] <= 60
    finally:
        store.close()
