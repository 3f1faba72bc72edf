"""The server's HTTP edge with a real server process: the token is checked before a body is
read, every route's body has a cap, and big bodies cannot make the server hold their size."""

from __future__ import annotations

import json
import threading

import pytest

from tests.support.body_flood import MIB, json_body, rss_bytes, send, timed_call
from tests.support.servers import ADMIN_TOKEN, ServerProcess

pytestmark = pytest.mark.slow


def _pid(server: ServerProcess) -> int:
    assert server.process is not None
    return server.process.pid


def test_an_unauthenticated_64_mib_body_is_refused_unread(server: ServerProcess) -> None:
    body = json_body(64 * MIB)
    server.client().jobs(limit=1)  # the server has answered once: its memory is settled
    peak_before = rss_bytes(_pid(server), "VmHWM")
    floods: list[object] = []
    latencies: list[float] = []

    def flood() -> None:
        floods.append(send(server.host, server.port, "POST", "/v1/jobs", body,
                           {"Content-Type": "application/json"}))  # fmt: skip

    threads = [threading.Thread(target=flood) for _ in range(3)]
    for thread in threads:
        thread.start()
    for _ in range(5):
        latencies.append(timed_call(server.host, server.port, ADMIN_TOKEN))
    for thread in threads:
        thread.join(timeout=300)
    grown = rss_bytes(_pid(server), "VmHWM") - peak_before
    for sent in floods:
        assert sent.status == 401, sent  # type: ignore[attr-defined]
        assert sent.answered_s < 5, sent  # type: ignore[attr-defined]
    assert grown < 32 * MIB, f"the server's peak memory grew {grown / MIB:.0f} MiB"
    assert max(latencies) < 2, latencies


def test_a_body_over_its_route_cap_is_413_naming_the_cap(server: ServerProcess) -> None:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {ADMIN_TOKEN}"}
    # Said up front (Content-Length): refused before the body is read.
    sent = send(server.host, server.port, "POST", "/v1/jobs/delete", json_body(8 * MIB), headers)
    assert sent.status == 413, sent
    error = json.loads(sent.body)["error"]
    assert "\n" not in error and "1 MiB" in error and "/v1/jobs/delete" in error, error
    # Sent in chunks with no length: refused once the cap is passed.
    sent = send(server.host, server.port, "POST", "/v1/jobs/delete", json_body(8 * MIB),
                headers, chunked=True)  # fmt: skip
    assert sent.status == 413, sent
    assert "1 MiB" in json.loads(sent.body)["error"]
    # The connection's next call is served as usual.
    assert server.client().jobs(limit=1) == []


def test_a_body_within_its_cap_still_works(server: ServerProcess) -> None:
    client = server.client()
    job = client.submit({"workload": {"kind": "command", "command": ["true"]}})
    assert client.job(job["id"])["state"] == "queued"
    # A wrong token with a body: 401, and the same one line as without a body.
    sent = send(server.host, server.port, "POST", "/v1/jobs/delete", b'{"jobs": ["x"]}',
                {"Authorization": "Bearer wrong", "Content-Type": "application/json"})  # fmt: skip
    assert sent.status == 401
    assert "token" in json.loads(sent.body)["error"]


def test_an_upload_streams_through_the_edge(server: ServerProcess) -> None:
    import io
    import tarfile

    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as archive:
        data = b"print('hi')\n" * 1000
        member = tarfile.TarInfo("main.py")
        member.size = len(data)
        archive.addfile(member, io.BytesIO(data))
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}",
               "Content-Type": "application/octet-stream"}  # fmt: skip
    sent = send(server.host, server.port, "PUT", "/v1/bundles", packed.getvalue(), headers,
                chunked=True)  # fmt: skip
    assert sent.status == 200, sent
    assert json.loads(sent.body)["bundle_id"].startswith("sha256:")
    # Without a token the same upload is refused before a byte of it is written.
    sent = send(server.host, server.port, "PUT", "/v1/bundles", packed.getvalue(),
                {"Content-Type": "application/octet-stream"})  # fmt: skip
    assert sent.status == 401
    assert not any((server.home / "incoming").glob("*"))


def test_a_dashboard_form_needs_its_session_before_its_body(server: ServerProcess) -> None:
    sent = send(server.host, server.port, "POST", "/ui/jobs/j-x/cancel", b"csrf=x" * 1000,
                {"Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert sent.status == 303
    # The login form is open, within its own small cap.
    sent = send(server.host, server.port, "POST", "/ui/login", b"t" * (64 * 1024),
                {"Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert sent.status == 413
    assert "16 KiB" in json.loads(sent.body)["error"]
