"""Every submit counts once: a create whose 201 reply is lost on the way is sent again by
the client with its Idempotency-Key, and the server answers with the jobs it made the first
time rather than making them again.

A real server process (SQLite and PostgreSQL) behind a loopback proxy that drops chosen
replies; the SDK in this process and the real command line in their own."""

from __future__ import annotations

import hashlib
import http.client
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import run_cli
from tests.support.fault_proxy import LossyProxy
from tests.support.servers import ADMIN_TOKEN, ServerProcess


def remote_job(*argv: str, **labels: str) -> dict[str, Any]:
    return {
        "workload": {"kind": "command", "command": list(argv)},
        "placement": {"target": "remote"},
        "resources": {"cpu_cores": 0.5},
        "labels": labels,
    }


class LosingEveryFirst:
    """Loses the reply of every other POST to ``path``: each request's first send never
    hears back, its resend does."""

    def __init__(self, path: str = "/v1/jobs") -> None:
        self.path = path
        self.sent = 0

    def __call__(self, method: str, path: str, _reply: bytes) -> bool:
        if (method, path.split("?")[0]) != ("POST", self.path):
            return False
        self.sent += 1
        return self.sent % 2 == 1


@pytest.fixture()
def lossy(
    tmp_path: Path, database_url: str | None
) -> Iterator[tuple[ServerProcess, LossyProxy, LosingEveryFirst]]:
    server = ServerProcess(tmp_path / "server", database_url=database_url).start()
    losing = LosingEveryFirst()
    proxy = LossyProxy(server.port, losing).start()
    try:
        yield server, proxy, losing
    finally:
        proxy.stop()
        server.stop()


def stored_job_ids(server: ServerProcess) -> list[str]:
    return sorted(job["id"] for job in server.client().jobs(limit=10_000))


def post_jobs(server: ServerProcess, body: Any, key: str | None) -> tuple[int, dict[str, str], Any]:
    """One POST /v1/jobs straight to the server, as any HTTP client would send it."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    try:
        conn.request("POST", "/v1/jobs", body=json.dumps(body), headers=headers)
        reply = conn.getresponse()
        return reply.status, dict(reply.getheaders()), json.loads(reply.read() or b"null")
    finally:
        conn.close()


@pytest.mark.slow
def test_sdk_launch_and_launch_many_with_lost_replies_store_each_job_once(
    lossy: tuple[ServerProcess, LossyProxy, LosingEveryFirst],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gpulayer as gl

    server, proxy, _ = lossy
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('trained')\n")
    monkeypatch.chdir(project)
    monkeypatch.setenv("GPULAYER_SERVER", proxy.url)
    monkeypatch.setenv("GPULAYER_TOKEN", ADMIN_TOKEN)

    many = gl.launch_many([remote_job("python", "train.py", i=str(i)) for i in range(25)])
    one = gl.launch(remote_job("python", "train.py", i="single"))

    assert proxy.lost, "no reply was lost: the proxy did not stand in the way"
    handed = sorted([job.id for job in many] + [one.id])
    assert len(set(handed)) == 26
    assert stored_job_ids(server) == handed  # each job once, and the ids the caller holds


@pytest.mark.slow
def test_cli_submit_and_array_with_lost_replies_store_each_job_once(
    lossy: tuple[ServerProcess, LossyProxy, LosingEveryFirst], tmp_path: Path
) -> None:
    server, proxy, _ = lossy
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('trained')\n")
    env = {
        "GPULAYER_SERVER": proxy.url,
        "GPULAYER_TOKEN": ADMIN_TOKEN,
        "GPULAYER_HOME": str(tmp_path / "client"),
    }
    submit = ["submit", "-d", "--target", "remote"]
    single = run_cli([*submit, "--", "python", "train.py"], env=env, cwd=project)
    assert single.returncode == 0, single.stderr
    job_id = single.stdout.strip().splitlines()[-1]
    array = run_cli([*submit, "--array", "0-9", "--", "python", "train.py"], env=env, cwd=project)
    assert array.returncode == 0, array.stderr
    array_id = array.stdout.strip().splitlines()[-1]

    assert proxy.lost
    jobs = server.client().jobs(limit=100)
    assert len(jobs) == 11
    assert job_id in {job["id"] for job in jobs}
    members = [job for job in jobs if job["labels"].get("gpulayer.array") == array_id]
    assert sorted(int(job["labels"]["gpulayer.array.index"]) for job in members) == list(range(10))


@pytest.mark.slow
def test_n_submits_with_every_first_reply_lost_give_n_jobs(
    lossy: tuple[ServerProcess, LossyProxy, LosingEveryFirst],
) -> None:
    from gpulayer.protocol.client import ControlClient

    server, proxy, losing = lossy
    client = ControlClient(proxy.url, ADMIN_TOKEN, timeout=30)
    made = [client.submit(remote_job("true", n=str(n)))["id"] for n in range(20)]
    lists = [client.submit_many([{"spec": remote_job("true", k=str(k))}] * 3) for k in range(5)]
    made += [view["id"] for views in lists for view in views]
    assert losing.sent == 2 * 25  # every request was sent twice: its first reply was lost
    assert len(proxy.lost) == 25
    assert stored_job_ids(server) == sorted(made)
    assert len(made) == 35


def test_a_key_sent_again_answers_with_the_first_jobs_and_a_new_body_is_refused(
    tmp_path: Path, database_url: str | None
) -> None:
    server = ServerProcess(tmp_path / "server", database_url=database_url).start()
    try:
        body = [{"spec": remote_job("true", n=str(n))} for n in range(3)]
        status, _, first = post_jobs(server, body, "key-1")
        assert status == 201
        status, headers, again = post_jobs(server, body, "key-1")
        assert status == 201
        assert headers.get("idempotent-replayed") == "true"
        assert [v["id"] for v in again] == [v["id"] for v in first]

        other = [{"spec": remote_job("false")}]
        status, _, refused = post_jobs(server, other, "key-1")
        assert status == 422
        assert refused["error"].startswith("Idempotency-Key:")
        assert "\n" not in refused["error"]
        status, _, bad = post_jobs(server, other, "a key with spaces")
        assert status == 400 and bad["error"].startswith("Idempotency-Key:")
        # Without a key every request creates, as before.
        assert post_jobs(server, other, None)[0] == 201
        assert post_jobs(server, other, None)[0] == 201
        assert len(stored_job_ids(server)) == 5
    finally:
        server.stop()


def test_concurrent_duplicates_create_once(tmp_path: Path, database_url: str | None) -> None:
    server = ServerProcess(tmp_path / "server", database_url=database_url).start()
    try:
        body = [{"spec": remote_job("true", n=str(n))} for n in range(50)]
        start = threading.Barrier(8)
        answers: list[tuple[int, list[str]]] = []

        def send() -> None:
            start.wait(10)
            status, _, views = post_jobs(server, body, "same-key")
            answers.append((status, [view["id"] for view in views]))

        threads = [threading.Thread(target=send) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(answers) == 8
        assert {status for status, _ in answers} == {201}
        assert len({tuple(ids) for _, ids in answers}) == 1  # every one names the same jobs
        assert stored_job_ids(server) == sorted(answers[0][1])
    finally:
        server.stop()


def test_the_key_is_kept_with_a_digest_of_the_request_not_its_body(
    tmp_path: Path, database_url: str | None
) -> None:
    server = ServerProcess(tmp_path / "server", database_url=database_url).start()
    try:
        body = {"spec": remote_job("echo", "a-secret-looking-argument")}
        assert post_jobs(server, body, "k")[0] == 201
        with server.store() as store, store.engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT key, fingerprint, answer FROM idempotency_keys")
            (kept,) = rows.all()
        wire = json.dumps(body).encode()
        assert kept.key == "k"
        assert kept.fingerprint == hashlib.sha256(b"POST /v1/jobs\n" + wire).hexdigest()
        assert "secret" not in kept.answer
    finally:
        server.stop()


def test_a_trigger_and_a_token_create_whose_replies_are_lost_count_once(
    tmp_path: Path, database_url: str | None
) -> None:
    from gpulayer.errors import StaleAttemptError
    from gpulayer.protocol.client import ControlClient

    server = ServerProcess(tmp_path / "server", database_url=database_url).start()
    direct = server.client()
    job = {"workload": {"kind": "command", "command": ["true"]}, "placement": {"target": "remote"}}
    schedule = {"name": "nightly", "cron": "0 0 1 1 *", "concurrency": "allow", "job": job}
    applies = LosingEveryFirst("/v1/schedules")
    triggers = LosingEveryFirst("/v1/schedules/nightly/trigger")
    tokens = LosingEveryFirst("/v1/tokens")
    proxy = LossyProxy(server.port, lambda *a: applies(*a) or triggers(*a) or tokens(*a)).start()
    try:
        client = ControlClient(proxy.url, ADMIN_TOKEN, timeout=30)
        applied = client.request("POST", "/v1/schedules", {"schedule": schedule})
        assert applies.sent == 2  # its first reply lost: answered as the first send was
        assert applied["created"] is True
        assert [s["name"] for s in direct.request("GET", "/v1/schedules")] == ["nightly"]
        started = [client.request("POST", "/v1/schedules/nightly/trigger") for _ in range(3)]
        assert triggers.sent == 6 and len(proxy.lost) == 4
        run_ids = sorted(reply["job_id"] for reply in started)
        assert sorted(j["id"] for j in direct.jobs(schedule="nightly")) == run_ids
        assert len(set(run_ids)) == 3

        before = {t["id"] for t in direct.request("GET", "/v1/tokens")}
        with pytest.raises(StaleAttemptError, match="Idempotency-Key: this request made token"):
            client.request("POST", "/v1/tokens", {"kind": "worker", "name": "lost"})
        made = [t for t in direct.request("GET", "/v1/tokens") if t["id"] not in before]
        assert [t["name"] for t in made] == ["lost"]  # one token, though sent twice
    finally:
        proxy.stop()
        server.stop()


def test_a_key_is_kept_for_its_window_then_forgotten(tmp_path: Path) -> None:
    import time

    from gpulayer.control.auth import LOCAL_ADMIN
    from gpulayer.control.idempotency import WINDOW_SECONDS, Answers, request_key
    from gpulayer.control.store import Store

    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    try:
        once = request_key(LOCAL_ADMIN, "k", "POST", "/v1/jobs", b"{}")

        def insert(job_id: str) -> None:
            store.insert_job(
                job_id=job_id,
                name="j",
                spec={},
                state="queued",
                target="remote",
                working_dir=None,
                labels={},
                once=once,
            )

        insert("j-first")
        assert WINDOW_SECONDS >= 24 * 3600
        assert Answers(store).prior(once) == ["j-first"]
        # Past its window the key is forgotten, and may name a new request.
        assert Answers(store, window=-1).prior(once) is None
        insert("j-second")
        assert Answers(store).prior(once) == ["j-second"]
        assert store.forget_answers_before(time.time() + 1) == 1
        assert Answers(store).prior(once) is None
    finally:
        store.close()
