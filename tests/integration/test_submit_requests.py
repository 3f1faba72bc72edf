"""What a `gpulayer submit` to a team server sends: its bundle is named by digest, uploaded
only to a server that lacks it, and a source sent before costs one request.

The real command line against a real server process, through a loopback proxy that notes
each request on its way."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import run_cli
from tests.support.fault_proxy import LossyProxy
from tests.support.servers import ADMIN_TOKEN, ServerProcess


@pytest.fixture()
def proxied(tmp_path: Path) -> Iterator[tuple[ServerProcess, LossyProxy, list[str]]]:
    server = ServerProcess(tmp_path / "server").start()
    seen: list[str] = []

    def note(method: str, path: str, _reply: bytes) -> bool:
        seen.append(f"{method} {path.split('?')[0]}")
        return False  # every reply goes through

    proxy = LossyProxy(server.port, note).start()
    try:
        yield server, proxy, seen
    finally:
        proxy.stop()
        server.stop()


def test_a_source_the_server_keeps_is_sent_by_digest_in_one_request(
    proxied: tuple[ServerProcess, LossyProxy, list[str]], tmp_path: Path
) -> None:
    server, proxy, seen = proxied
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('trained')\n")
    env = {
        "GPULAYER_SERVER": proxy.url,
        "GPULAYER_TOKEN": ADMIN_TOKEN,
        "GPULAYER_HOME": str(tmp_path / "client"),
    }

    def submit() -> str:
        done = run_cli(
            ["submit", "-d", "--target", "remote", "--", "python", "train.py"],
            env=env,
            cwd=project,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().splitlines()[-1]

    first = submit()
    # The server lacked the bundle: the job named by digest was refused, nothing was kept
    # of it, the bundle went up once, and the job was sent again.
    assert seen == ["POST /v1/jobs", "PUT /v1/bundles", "POST /v1/jobs"]
    seen.clear()
    second = submit()
    assert seen == ["POST /v1/jobs"]
    client = server.client()
    jobs = client.jobs(limit=10)
    assert sorted(j["id"] for j in jobs) == sorted([first, second])
    (kept,) = (server.home / "bundles").iterdir()  # one file, named by both jobs
    with server.store() as store:
        digests = {store.get_job(job_id).bundle_digest for job_id in (first, second)}
    assert digests == {kept.name.removesuffix(".tar.gz")}
