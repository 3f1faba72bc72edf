"""`gpulayer logs -f` waits out a team server restart: while the server is down it says once
that it reconnects, and once the server is back it goes on after the last line it printed,
with no line lost or printed twice, and exits as the job did.

Real processes: a team server (killed and started again on the same port and database), a
worker, and the CLI following the job."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cluster import command_job, submit
from tests.support.servers import ADMIN_TOKEN, ServerProcess, WorkerProcess, wait_for_workers

# Prints ten lines, waits for the test's go (the server has been restarted meanwhile), then
# prints ten more.
_GATED = (
    "import os, sys, time\n"
    "for i in range(10):\n"
    "    print(f'line {i}', flush=True)\n"
    "deadline = time.monotonic() + 120\n"
    "while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:\n"
    "    time.sleep(0.05)\n"
    "for i in range(10, 20):\n"
    "    print(f'line {i}', flush=True)\n"
)
RECONNECTING = "reconnecting"


def _wait_for(what: str, check: object, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_logs_follow_waits_out_a_server_restart(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "server", heartbeat_timeout=30).start()
    worker: WorkerProcess | None = None
    follower: subprocess.Popen[bytes] | None = None
    out, err = tmp_path / "follow.out", tmp_path / "follow.err"
    go = tmp_path / "go"
    try:
        client = server.client()
        token = client.request("POST", "/v1/tokens", {"kind": "worker"})["token"]
        worker = WorkerProcess(server.url, token, tmp_path / "w0", "w0").start(0.5)
        wait_for_workers(client, 1)
        job = submit(client, command_job([sys.executable, "-c", _GATED, str(go)]))
        env = {**os.environ, "GPULAYER_TOKEN": ADMIN_TOKEN}
        with out.open("wb") as stdout, err.open("wb") as stderr:
            follower = subprocess.Popen(
                [sys.executable, "-m", "gpulayer", "logs", "-f", job, "--server", server.url],
                stdout=stdout,
                stderr=stderr,
                env=env,
            )
        _wait_for("the first ten lines", lambda: "line 9\n" in out.read_text())

        server.kill()
        server.start()  # the same port, home and database
        go.touch()
        code = follower.wait(timeout=120)
    finally:
        if follower is not None and follower.poll() is None:
            follower.kill()
            follower.wait()
        if worker is not None:
            worker.stop()
        server.stop()

    printed = out.read_text().splitlines()
    said = err.read_text()
    assert code == 0, (printed, said)
    assert printed == [f"line {i}" for i in range(20)], (printed, said)
    assert said.count(RECONNECTING) == 1, said
    assert "Traceback" not in said
