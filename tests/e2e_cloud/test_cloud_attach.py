"""`ports`, `gpulayer attach` and `gpulayer exec` on a rented machine (a real sshd host of its
own): a job serving HTTP on its machine's port 6006 (as TensorBoard does) is reached from this
machine's localhost through the control plane's SSH session, and commands run in its folder and
environment, for as long as the job runs."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.e2e_cloud.journey import wait_until
from tests.e2e_cloud.test_cloud_ssh_journey import host_entry, write_providers
from tests.support.cli import run_cli
from tests.support.doc_examples import scan
from tests.support.servers import free_port

pytestmark = pytest.mark.slow

SERVES = (
    "import http.server, pathlib; pathlib.Path('index.html').write_text('from the job'); "
    "http.server.ThreadingHTTPServer(('127.0.0.1', 6006), "
    "http.server.SimpleHTTPRequestHandler).serve_forever()"
)


def example(name: str) -> Any:
    return scan().by_name()[name]


def _fetch(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/index.html", timeout=5) as page:
            return str(page.read().decode())
    except OSError:
        return None


def test_attach_forwards_the_jobs_port_and_exec_runs_in_it_while_it_runs(
    ssh_hosts: Any, cloud_home: Path, tmp_path: Path
) -> None:
    (host,) = ssh_hosts(1)
    write_providers(cloud_home, [host_entry(host, "rented", 0.5, tmp_path / "installs")])
    spec = tmp_path / "board.json"
    spec.write_text(
        json.dumps(
            {
                "workload": {"kind": "command", "command": ["python", "-c", SERVES]},
                "placement": {"target": "cloud"},
                "ports": [6006],
            }
        )
    )
    job_id = run_cli(["submit", "-d", "-f", str(spec)], timeout=120).stdout.strip()
    assert job_id.startswith("j-"), job_id

    def running() -> bool:
        return bool(json.loads(run_cli(["status", job_id, "--json"]).stdout)["state"] == "running")

    wait_until(running, what="the job to run")
    shown = run_cli(["status", job_id])
    assert f"6006 (gpulayer attach {job_id} forwards them here)" in shown.stdout

    # The manual's line (docs/jobspec-readings.md), with this job and a free port here.
    local = free_port()
    line = example("jobspec-attach").commands()[1]
    argv = shlex.split(line.replace("JOB", job_id).replace("16006", str(local)))
    assert argv[:2] == ["gpulayer", "attach"] and argv[-1] == f"{local}:6006", argv
    attach = subprocess.Popen(
        [sys.executable, "-m", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        page = wait_until(lambda: _fetch(local), what="the job's page through attach")
        assert page == "from the job"

        # exec: in the job's folder (where it wrote index.html) and environment, exiting as
        # the command did, each run recorded in the job's log.
        ran = run_cli(
            ["exec", job_id, "--", "sh", "-c", 'cat index.html; echo " $GPULAYER_JOB_ID"']
        )
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout == f"from the job {job_id}\n"
        failed = run_cli(["exec", job_id, "--", "sh", "-c", "echo oops >&2; exit 3"])
        assert (failed.returncode, failed.stderr) == (3, "oops\n")
        missing = run_cli(["exec", job_id, "--", "no-such-program"])
        assert missing.returncode != 0 and "no-such-program" in missing.stderr
        shown = run_cli(["logs", job_id])
        logged = shown.stdout + shown.stderr
        assert "exec on node 0: sh -c 'echo oops >&2; exit 3' (exit 3)" in logged, logged

        assert run_cli(["cancel", job_id]).returncode == 0
        out, err = attach.communicate(timeout=60)
        assert attach.returncode == 0, err
        assert f"localhost:{local} -> job {job_id} port 6006" in out
        assert f"job {job_id} ended; forwarding stopped" in out
    finally:
        if attach.poll() is None:
            attach.kill()
            attach.wait()
    deadline = time.monotonic() + 30
    while _fetch(local) is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _fetch(local) is None  # nothing listens here once attach ended


def test_attach_refusals_are_one_line(cloud_home: Path) -> None:
    bad = run_cli(["attach", "j-nothing", "--port", "99999"])
    not_running = run_cli(["exec", "j-nothing", "--", "true"])
    assert not_running.returncode == 2 and "Traceback" not in not_running.stderr
    assert bad.returncode == 2
    assert bad.stderr == "error: --port: expected PORT or LOCAL:PORT (1-65535), got '99999'\n"
    local_job = run_cli(["submit", "-d", "--", "sleep", "30"]).stdout.strip()
    try:
        no_ports = run_cli(["attach", local_job])
        assert no_ports.returncode == 2
        assert no_ports.stderr.startswith("error: --port: the job names no ports"), no_ports.stderr
    finally:
        run_cli(["cancel", local_job])
