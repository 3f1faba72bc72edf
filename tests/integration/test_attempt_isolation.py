"""Each job runs once and its outcome is its own, with real server and worker processes.

A crashed worker takes its jobs' processes with it, a worker cut off past its heartbeat
timeout cannot overwrite what the job's next attempt did, and one job cannot act for another.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpulayer.errors import ForbiddenError, StaleAttemptError
from gpulayer.protocol.bundle import create_bundle
from gpulayer.protocol.client import ControlClient, Unauthorized
from tests.support.cluster import Cluster, command_job, submit
from tests.support.fault_proxy import LossyProxy
from tests.support.procs import DAEMON_PREAMBLE, processes_with, wait_until
from tests.support.servers import (
    ADMIN_TOKEN,
    WorkerProcess,
    wait_for_job,
    wait_for_workers,
    without_cgroup_v2,
)

pytestmark = pytest.mark.slow

# Forks a daemon that leaves the session (setsid, then a second fork) and sleeps; then the body:
# attempt 1 holds for HOLD seconds, a later attempt ends at once. Each finished body appends its
# attempt number to the ledger.
_BODY = (
    DAEMON_PREAMBLE
    + """
hold = float(sys.argv[2]) if os.environ["GPULAYER_ATTEMPT"] == "1" else 0.2
time.sleep(hold)
out = os.environ["GPULAYER_OUTPUT_DIR"]
with open(os.path.join(out, "who.txt"), "w") as f:
    f.write(os.environ["GPULAYER_ATTEMPT"])
with open(sys.argv[3], "a") as f:
    f.write(os.environ["GPULAYER_ATTEMPT"] + "\\n")
"""
)


def body_job(marker: str, hold: float, ledger: Path) -> dict[str, Any]:
    spec = command_job(["python", "-c", _BODY, marker, str(hold), str(ledger)])
    spec["retry"] = {"max_attempts": 2, "retry_on": ["worker_lost"]}
    return spec


def worker_named(cluster: Cluster, name: str) -> WorkerProcess:
    return next(w for w in cluster.workers if w.name == name)


def running_on(client: ControlClient, job_id: str) -> str:
    wait_for_job(client, job_id, {"running"})
    wait_until(lambda: client.job(job_id)["attempts"][-1]["state"] == "running", 30, "claimed")
    return str(client.job(job_id)["attempts"][-1]["worker_name"])


def artifact_text(client: ControlClient, job_id: str, path: str, scratch: Path) -> str:
    target = scratch / secrets.token_hex(4)
    client.download_artifact(job_id, path, target)
    return target.read_text()


def test_kill_9_of_a_worker_ends_its_jobs_trees_and_the_body_runs_to_completion_once(
    cluster_factory: Any, tmp_path: Path
) -> None:
    cluster = cluster_factory(2)
    client = cluster.client
    marker = f"gl-kill9-{secrets.token_hex(4)}"
    ledger = tmp_path / "ledger"
    job_id = submit(client, body_job(marker, 120, ledger))
    victim = worker_named(cluster, running_on(client, job_id))
    wait_until(lambda: len(processes_with(marker, attempt=1)) >= 2, 30, "job and its daemon up")
    victim.signal(signal.SIGKILL)  # the worker alone: its jobs sit in sessions of their own
    wait_until(
        lambda: not processes_with(marker, attempt=1), 15, "attempt 1's processes outlived it"
    )
    job = wait_for_job(client, job_id, {"succeeded", "failed"}, timeout=60)
    assert job["state"] == "succeeded", job
    assert [a["reason"] for a in job["attempts"]] == ["worker_lost", None]
    assert ledger.read_text().split() == ["2"]  # attempt 1 never got to finish its body
    wait_until(lambda: not processes_with(marker), 15, "attempt 2's daemon outlived the job")


@pytest.mark.parametrize("stale_attempt", ["finishes while its worker is stopped", "runs on"])
def test_a_worker_stopped_past_its_timeout_cannot_touch_the_retry(
    cluster_factory: Any, tmp_path: Path, stale_attempt: str
) -> None:
    cluster = cluster_factory(2)
    client = cluster.client
    marker = f"gl-stop-{secrets.token_hex(4)}"
    ledger = tmp_path / "ledger"
    hold = 3.0 if stale_attempt.startswith("finishes") else 300.0
    job_id = submit(client, body_job(marker, hold, ledger))
    frozen = worker_named(cluster, running_on(client, job_id))
    # The body and the daemon it forks: one process alone may still be the shell that holds
    # the job until its worker has moved it into the attempt's cgroup, and a worker stopped
    # then would never let the body start.
    wait_until(lambda: len(processes_with(marker, attempt=1)) >= 2, 30, "attempt 1's body up")
    frozen.signal(signal.SIGSTOP)  # silent but alive: what a network partition looks like
    try:
        job = wait_for_job(client, job_id, {"succeeded", "failed"}, timeout=60)
        assert job["state"] == "succeeded", job
        assert artifact_text(client, job_id, "who.txt", tmp_path) == "2"
        if hold < 100:
            wait_until(lambda: ledger.read_text().split() == ["2", "1"], 30, "attempt 1's late end")
    finally:
        frozen.signal(signal.SIGCONT)
    # Resumed, the stale attempt's tree ends at once and its late writes are refused.
    wait_until(lambda: not processes_with(marker, attempt=1), 15, "the stale tree ended")
    log = frozen.home / "worker.log"
    wait_until(lambda: "no longer" in log.read_text(), 30, "the worker heard it was fenced")
    final = client.job(job_id)
    assert final["state"] == "succeeded"
    assert [a["state"] for a in final["attempts"]] == ["failed", "succeeded"]
    assert artifact_text(client, job_id, "who.txt", tmp_path) == "2"
    assert [a["path"] for a in client.artifacts(job_id)] == ["who.txt"]
    assert all(
        line["attempt"] != 1 or "retrying" in line["text"] or line["stream"] != "system"
        for line in client.logs(job_id)["lines"]
        if "exited with code" in line["text"]
    )  # no outcome line of the stale attempt reached the job's log


def test_a_lost_claim_reply_is_retried_not_left_running(
    cluster_factory: Any, tmp_path: Path
) -> None:
    cluster = cluster_factory(0)
    client = cluster.client
    lose_first = {"left": 1}

    def lose(method: str, path: str, body: bytes) -> bool:
        claim = path.split("?")[0].endswith("/claim") and body.strip() not in (b"", b"[]")
        if claim and lose_first["left"]:
            lose_first["left"] -= 1
            return True
        return False

    upstream = int(cluster.server.url.rsplit(":", 1)[1])
    proxy = LossyProxy(upstream, lose).start()
    try:
        cluster.workers.append(
            WorkerProcess(proxy.url, cluster.worker_token, tmp_path / "w", "behind-proxy").start()
        )
        wait_for_workers(client, 1)
        marker = f"gl-claim-{secrets.token_hex(4)}"
        ledger = tmp_path / "ledger"
        job_id = submit(client, body_job(marker, 0.2, ledger))
        job = wait_for_job(client, job_id, {"succeeded", "failed"}, timeout=60)
        assert proxy.lost, "the proxy never lost a claim reply"
        assert job["state"] == "succeeded", job
        assert [a["reason"] for a in job["attempts"]] == ["worker_lost", None]
        assert ledger.read_text().split() == ["2"]
    finally:
        proxy.stop()


def test_a_bundle_fetch_cut_off_is_retried_and_the_job_runs_once(
    cluster_factory: Any, tmp_path: Path
) -> None:
    """The control plane is away while a worker fetches a job's source (a restart, a tunnel
    being reopened): the fetch waits it out rather than failing the job as the worker's error."""
    cluster = cluster_factory(0)
    client = cluster.client
    cut_off = {"left": 2}  # one more than the client's own retry of a dropped keep-alive connection

    def lose(method: str, path: str, body: bytes) -> bool:
        if method == "GET" and path.split("?")[0].endswith("/bundle") and cut_off["left"]:
            cut_off["left"] -= 1
            return True
        return False

    upstream = int(cluster.server.url.rsplit(":", 1)[1])
    proxy = LossyProxy(upstream, lose).start()
    try:
        worker = WorkerProcess(proxy.url, cluster.worker_token, tmp_path / "w", "fetching")
        cluster.workers.append(worker.start())
        wait_for_workers(client, 1)
        source = tmp_path / "source"
        source.mkdir()
        ledger = tmp_path / "ledger"
        (source / "job.py").write_text(
            f"open({str(ledger)!r}, 'a').write(__import__('os').environ['GPULAYER_ATTEMPT'])"
        )
        bundle = tmp_path / "source.tar.gz"
        create_bundle(source, bundle)
        spec = command_job(["python", "job.py"])
        job_id = client.submit(spec, bundle_id=client.upload_bundle(bundle))["id"]
        job = wait_for_job(client, job_id, {"succeeded", "failed"}, timeout=90)
        assert cut_off["left"] == 0, "the proxy never cut a bundle fetch off"
        assert job["state"] == "succeeded", job
        assert [a["state"] for a in job["attempts"]] == ["succeeded"]
        assert ledger.read_text() == "1"  # the body ran once, in its first attempt
        assert "fetching the job's source" in (worker.home / "worker.log").read_text()
    finally:
        proxy.stop()


def test_outputs_skip_links_and_fifos_and_the_job_still_ends(
    cluster_factory: Any, tmp_path: Path
) -> None:
    cluster = cluster_factory(1)
    client = cluster.client
    script = (
        'cd "$GPULAYER_OUTPUT_DIR" && ln -s /etc/passwd leak && mkfifo pipe && '
        "mkdir sub && ln -s / sub/root && echo ok > result.txt"
    )
    job_id = submit(client, command_job(["sh", "-c", script]))
    job = wait_for_job(client, job_id, {"succeeded", "failed"}, timeout=60)
    assert job["state"] == "succeeded", job
    assert [a["path"] for a in client.artifacts(job_id)] == ["result.txt"]
    texts = [line["text"] for line in client.logs(job_id)["lines"]]
    assert any("outputs: skipped leak: a symbolic link" in t for t in texts), texts
    assert any("outputs: skipped pipe: a fifo" in t for t in texts), texts
    assert any("outputs: skipped sub/root: a symbolic link" in t for t in texts), texts
    # Cancel still wins over whatever a finished job's worker was doing.
    cancelled = client.cancel(job_id)
    assert cancelled["state"] == "succeeded"


def cli(*args: str) -> Any:
    from tests.support.cli import run_cli

    return run_cli(list(args))


def cli_with(env: dict[str, str], *args: str) -> Any:
    from tests.support.cli import run_cli

    return run_cli(list(args), env=env)


def register_body(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "capabilities": {"cpu_cores": 1, "memory_gb": 1}, **extra}


def test_a_worker_credential_reaches_only_its_own_worker_and_attempts(
    cluster_factory: Any, tmp_path: Path
) -> None:
    cluster = cluster_factory(0)
    admin = cluster.client
    join = ControlClient(cluster.server.url, cluster.worker_token)
    first = join.request("POST", "/v1/workers", register_body("a"))
    second = join.request("POST", "/v1/workers", register_body("b"))
    assert first["token"] and first["token"] != second["token"] != cluster.worker_token
    as_a = ControlClient(cluster.server.url, first["token"])
    as_b = ControlClient(cluster.server.url, second["token"])
    job_id = submit(admin, command_job(["true"], worker_ids=[second["worker_id"]]))
    with pytest.raises(ForbiddenError):  # a's credential cannot claim b's work
        as_a.request("POST", f"/v1/workers/{second['worker_id']}/claim")
    with pytest.raises(ForbiddenError):
        as_a.request("POST", f"/v1/workers/{second['worker_id']}/heartbeat", {"running": []})
    (assignment,) = as_b.request("POST", f"/v1/workers/{second['worker_id']}/claim")
    attempt = assignment["attempt_id"]
    report = {"state": "succeeded", "exit_code": 0}
    with pytest.raises(ForbiddenError):
        as_a.request("POST", f"/v1/attempts/{attempt}/logs", {"lines": [["stdout", "forged"]]})
    with pytest.raises(ForbiddenError):
        as_a.request("POST", f"/v1/attempts/{attempt}/finish", report)
    with pytest.raises(ForbiddenError):
        as_a.request("PUT", f"/v1/attempts/{attempt}/outputs", raw=b"")
    with pytest.raises(ForbiddenError):  # a join token can do nothing but register
        join.request("POST", f"/v1/attempts/{attempt}/finish", report)
    with pytest.raises(ForbiddenError):  # nor become a worker that exists
        join.request("POST", "/v1/workers", register_body("b2", worker_id=second["worker_id"]))
    with pytest.raises(ForbiddenError):
        as_a.request("POST", "/v1/workers", register_body("b3", worker_id=second["worker_id"]))
    with pytest.raises(ForbiddenError):  # the control plane's own local worker is not for hire
        join.request("POST", "/v1/workers", register_body("l", kind="local"))
    as_b.request("POST", f"/v1/attempts/{attempt}/finish", report)
    assert admin.job(job_id)["state"] == "succeeded"
    with pytest.raises(StaleAttemptError):  # and a finished attempt's outputs never change
        as_b.request("PUT", f"/v1/attempts/{attempt}/outputs", raw=b"")
    with pytest.raises(StaleAttemptError):
        as_b.request("POST", f"/v1/attempts/{attempt}/logs", {"lines": [["stdout", "late"]]})
    assert not any(line["text"] == "late" for line in admin.logs(job_id)["lines"])


def test_join_tokens_cap_expiry_and_revocation_from_the_cli(
    cluster_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.servers import ADMIN_TOKEN

    cluster = cluster_factory(0)
    monkeypatch.setenv("GPULAYER_SERVER", cluster.server.url)
    monkeypatch.setenv("GPULAYER_TOKEN", ADMIN_TOKEN)
    capped = cli("token", "create", "--worker", "--max-workers", "2", "--name", "pool")
    assert capped.returncode == 0, capped.stderr
    token = capped.stdout.strip()
    join = ControlClient(cluster.server.url, token)
    made = [join.request("POST", "/v1/workers", register_body(f"w{i}")) for i in range(2)]
    with pytest.raises(ForbiddenError, match="all the workers it may"):
        join.request("POST", "/v1/workers", register_body("w3"))
    listing = cli("token", "ls", "--json")
    (row,) = [t for t in json.loads(listing.stdout) if t["name"] == "pool"]
    assert row["kind"] == "join" and row["registered"] == 2 and row["max_workers"] == 2
    assert token not in listing.stdout
    credential = ControlClient(cluster.server.url, made[0]["token"])
    credential.request("POST", f"/v1/workers/{made[0]['worker_id']}/heartbeat", {"running": []})
    revoked = cli("token", "revoke", row["id"])
    assert revoked.returncode == 0, revoked.stderr
    with pytest.raises(Unauthorized):  # refused on the very next call, its workers too
        join.request("POST", "/v1/workers", register_body("w4"))
    with pytest.raises(Unauthorized):
        credential.request("POST", f"/v1/workers/{made[0]['worker_id']}/heartbeat")
    short = cli("token", "create", "--worker", "--expires", "1s").stdout.strip()
    expiring = ControlClient(cluster.server.url, short)

    def refused() -> bool:
        try:
            expiring.request("POST", "/v1/workers", register_body("late"))
        except Unauthorized:
            return True
        return False

    wait_until(refused, 10, "an expired join token still registers workers")
    bad = cli("token", "create", "--max-workers", "0", "--worker")
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --max-workers: must be at least 1"
    bad = cli("token", "create", "--worker", "--expires", "soon")
    assert bad.returncode == 2 and "--expires" in bad.stderr and "Traceback" not in bad.stderr


_ATTACK = r"""
import json, os, re, sys, urllib.request
server = sys.argv[1]
pattern = re.compile(rb"gl_[A-Za-z0-9_-]{40,}")
found, notes = set(), []
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    for name in ("cmdline", "environ"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                found.update(m.decode() for m in pattern.findall(f.read()))
        except OSError as exc:
            notes.append(f"{pid}/{name}: {exc.strerror}")
for value in os.environ.values():
    found.update(m.decode() for m in pattern.findall(value.encode()))
for root in ("/tmp", os.path.expanduser("~")):
    for folder, _, files in os.walk(root):
        for file in files:
            try:
                with open(os.path.join(folder, file), "rb") as f:
                    found.update(m.decode() for m in pattern.findall(f.read(65536)))
            except OSError:
                pass
accepted = []
for token in sorted(found) + ["guess"]:
    for attempt in range(1, 12):
        body = json.dumps({"state": "succeeded", "exit_code": 0}).encode()
        request = urllib.request.Request(
            f"{server}/v1/attempts/{attempt}/finish", data=body, method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=5)
            accepted.append(attempt)
        except Exception:
            pass
print("ATTACK " + json.dumps({"found": sorted(found), "accepted": accepted}))
"""


@pytest.fixture
def open_work_dir() -> Iterator[Path]:
    """A work dir the run-as user can reach (pytest's own tree is closed to others)."""
    base = Path(tempfile.mkdtemp(prefix="gpulayer-runas-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="running jobs as another user needs root")
def test_a_job_cannot_find_a_credential_or_forge_another_jobs_outcome(
    cluster_factory: Any, tmp_path: Path, open_work_dir: Path
) -> None:
    python = shutil.which("python3", path="/usr/bin:/bin")
    assert python, "the tests need Debian's /usr/bin/python3 for jobs run as nobody"
    cluster = cluster_factory(0)
    client = cluster.client
    worker = cluster.add_worker(
        "isolated", None, "--run-as", "nobody", "--work-dir", str(open_work_dir)
    )
    wait_for_workers(client, 1)
    cmdline = Path(f"/proc/{worker.process.pid}/cmdline").read_bytes()  # type: ignore[union-attr]
    assert cluster.worker_token.encode() not in cmdline
    gate = open_work_dir / "gate"
    victim = submit(
        client,
        command_job(
            [
                python,
                "-c",
                f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.1)\nprint('victim done')",
            ]
        ),
    )
    wait_for_job(client, victim, {"running"})
    attacker = submit(client, command_job([python, "-c", _ATTACK, cluster.server.url]))
    done = wait_for_job(client, attacker, {"succeeded", "failed"}, timeout=120)
    assert done["state"] == "succeeded", done
    (line,) = [x["text"] for x in client.logs(attacker)["lines"] if x["text"].startswith("ATTACK ")]
    report = json.loads(line.removeprefix("ATTACK "))
    assert report == {"found": [], "accepted": []}
    assert client.job(victim)["state"] == "running"
    gate.touch()
    finished = wait_for_job(client, victim, {"succeeded", "failed"}, timeout=60)
    assert finished["state"] == "succeeded" and finished["exit_code"] == 0
    assert any(x["text"].strip() == "victim done" for x in client.logs(victim)["lines"])


def test_a_root_worker_without_run_as_says_its_jobs_can_read_its_credential(
    cluster_factory: Any,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the warning is for workers running as root")
    cluster = cluster_factory(1)
    log = cluster.workers[0].home / "worker.log"
    wait_until(lambda: "without --run-as" in log.read_text(), 10, "no warning at start")
    assert log.read_text().count("without --run-as") == 1
    assert log.read_text().count("can read its credential") == 1
    (worker,) = cluster.client.workers()
    assert worker["capabilities"]["isolation"] == "none"
    table, page = _workers_as_shown(cluster.server.url)
    assert "runs its jobs as its own user: they can read its credential" in table
    assert "none: its jobs can read its credential" in page


def _workers_as_shown(server_url: str) -> tuple[str, str]:
    """`gpulayer workers` (its words unfolded) and the dashboard's workers page."""
    env = {"GPULAYER_SERVER": server_url, "GPULAYER_TOKEN": ADMIN_TOKEN}
    table = cli_with(env, "workers")
    assert table.returncode == 0, table.stderr
    with httpx.Client(base_url=server_url, timeout=30) as http:
        form = http.get("/ui/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert csrf
        http.post("/ui/login", data={"csrf": csrf.group(1), "token": ADMIN_TOKEN})
        page = http.get("/ui/workers")
        assert page.status_code == 200
    return " ".join(table.stdout.split()), page.text


def test_require_isolation_refuses_to_start_a_worker_whose_jobs_could_read_its_credential(
    tmp_path: Path,
) -> None:
    token_file = tmp_path / "join.token"
    token_file.write_text("gl_x\n")
    result = cli(
        "worker", "start", "--server", "http://127.0.0.1:9", "--token-file", str(token_file),
        "--require-isolation",
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().startswith("error: --require-isolation: this worker")
    assert "can read its credential" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="--run-as needs root")
def test_require_isolation_refuses_jobs_that_share_one_run_as_user(tmp_path: Path) -> None:
    token_file = tmp_path / "join.token"
    token_file.write_text("gl_x\n")
    result = cli(
        "worker", "start", "--server", "http://127.0.0.1:9", "--token-file", str(token_file),
        "--run-as", "nobody", "--require-isolation",
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: --require-isolation: "), line
    assert "--run-as-range" in line and "Traceback" not in result.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="--run-as needs root")
def test_a_worker_whose_jobs_share_one_user_says_they_can_reach_each_other(
    cluster_factory: Any, open_work_dir: Path
) -> None:
    cluster = cluster_factory(0)
    worker = cluster.add_worker(
        "shared", None, "--run-as", "nobody", "--work-dir", str(open_work_dir)
    )
    (row,) = wait_for_workers(cluster.client, 1)
    log = worker.home / "worker.log"
    assert log.read_text().count("can reach each other") == 1, log.read_text()[-2000:]
    assert row["capabilities"]["isolation"] == "shared_uid"  # type: ignore[index]
    table, page = _workers_as_shown(cluster.server.url)
    assert "worker shared runs all its jobs as one user: they can reach each other" in table
    assert "shared_uid: its jobs can reach each other" in page


_READ_PROC = """
import sys
for name in ("environ", "mem"):
    try:
        open(f"/proc/{sys.argv[1]}/{name}", "rb").read(64)
        print(name, "read")
    except OSError as exc:
        print(name, exc.strerror)
"""
_NON_DUMPABLE = r"""
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("hardening", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
if sys.argv[2] == "harden":
    assert module.make_non_dumpable()
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run processes as another user")
@pytest.mark.parametrize("hardened", [True, False])
def test_a_non_dumpable_worker_hides_its_memory_from_jobs_of_its_own_user(
    hardened: bool,
) -> None:
    import subprocess

    python = "/usr/bin/python3"
    hardening = Path(__file__).resolve().parents[2] / "gpulayer" / "worker" / "hardening.py"
    runuser = shutil.which("runuser")
    assert runuser, "util-linux runuser is needed"
    as_nobody = [runuser, "-u", "nobody", "--"]
    holder = subprocess.Popen(
        [*as_nobody, python, "-c", _NON_DUMPABLE, str(hardening),
         "harden" if hardened else "plain"],
        stdout=subprocess.PIPE,
        env={"SECRET_OF_THE_WORKER": "s3cr3t-value", "PATH": "/usr/bin:/bin"},
        start_new_session=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"ready"
        (pid,) = [
            p
            for p in processes_with(str(hardening))
            if Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()[1] == str(holder.pid)
        ]
        spy = subprocess.run(
            [*as_nobody, python, "-c", _READ_PROC, str(pid)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        lines = dict(line.split(" ", 1) for line in spy.stdout.splitlines())
        if hardened:
            assert lines == {"environ": "Permission denied", "mem": "Permission denied"}, spy
        else:
            assert lines["environ"] == "read", spy  # the same user reads it otherwise
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # runuser and the python it started
        holder.wait(10)


def test_worker_start_refuses_a_token_on_the_command_line(tmp_path: Path) -> None:
    result = cli("worker", "start", "--server", "http://127.0.0.1:9", "--token", "gl_x")
    assert result.returncode == 2
    assert "--token" in result.stderr and "Traceback" not in result.stderr
    missing = cli(
        "worker", "start", "--server", "http://127.0.0.1:9", "--token-file", str(tmp_path / "nope")
    )
    assert missing.returncode == 2
    assert missing.stderr.strip().startswith("error: --token-file: cannot read")
    assert sys.executable  # the CLI ran under this interpreter


# Job X looks for job Y by its argv marker, tries to read Y's environment, and plants a file in
# Y's output folder (whose path it can work out from its own).
_SPY = r"""
import json, os, sys
marker, victim_job = sys.argv[1], sys.argv[2]
report = {"seen": False, "environ": None, "planted": False}
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if marker.encode() not in f.read() or int(pid) == os.getpid():
                continue
    except OSError:
        continue
    report["seen"] = True
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            report["environ"] = f.read().decode(errors="replace")
    except OSError as exc:
        report["environ_error"] = exc.strerror
mine = os.environ["GPULAYER_OUTPUT_DIR"]
attempt_dir = os.path.dirname(mine)
theirs = os.path.join(os.path.dirname(os.path.dirname(attempt_dir)), victim_job,
                      os.path.basename(attempt_dir), "output")
try:
    with open(os.path.join(theirs, "planted.txt"), "w") as f:
        f.write("from another job")
    report["planted"] = True
except OSError as exc:
    report["plant_error"] = exc.strerror
print("SPY " + json.dumps(report), flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="running jobs as other users needs root")
def test_each_attempt_runs_as_its_own_uid_and_no_job_reaches_another(
    cluster_factory: Any, tmp_path: Path, open_work_dir: Path
) -> None:
    python = shutil.which("python3", path="/usr/bin:/bin")
    assert python
    cluster = cluster_factory(0)
    client = cluster.client
    cluster.add_worker(
        "ranged", None, "--run-as-range", "61000-61009", "--work-dir", str(open_work_dir)
    )
    wait_for_workers(client, 1)
    marker = f"gl-victim-{secrets.token_hex(4)}"
    token_value = f"hf_{secrets.token_hex(12)}"
    gate = open_work_dir / "gate"
    wait_code = f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.1)\n"
    victim_spec = command_job([python, "-c", wait_code, marker])
    victim_spec["env"] = {"HF_TOKEN": token_value}
    victim = submit(client, victim_spec)
    wait_for_job(client, victim, {"running"})
    wait_until(lambda: processes_with(marker), 30, "the victim's process is up")
    spy = submit(client, command_job([python, "-c", _SPY, marker, victim]))
    done = wait_for_job(client, spy, {"succeeded", "failed"}, timeout=60)
    assert done["state"] == "succeeded", done
    (line,) = [x["text"] for x in client.logs(spy)["lines"] if x["text"].startswith("SPY ")]
    report = json.loads(line.removeprefix("SPY "))
    # It found the victim's process, and was refused both its environment and its folder.
    assert report["seen"] is True, report
    assert report["environ"] is None, report
    assert report.get("environ_error") == "Permission denied", report
    assert report["planted"] is False, report
    assert report.get("plant_error") == "Permission denied", report
    assert token_value not in line
    (victim_pid,) = processes_with(marker)
    attempt_dir = open_work_dir / victim / "attempt-1"
    owner = attempt_dir.stat()
    assert owner.st_uid == Path(f"/proc/{victim_pid}").stat().st_uid
    assert 61000 <= owner.st_uid <= 61009 and owner.st_mode & 0o777 == 0o700
    gate.touch()
    finished = wait_for_job(client, victim, {"succeeded", "failed"}, timeout=60)
    assert finished["state"] == "succeeded", finished
    assert [a["path"] for a in client.artifacts(victim)] == []


# A job that leaves behind, for whoever gets its uid next: a daemon out of its session whose
# environment holds nothing but its secret (no attempt tag), and 0600 files in the shared temp
# folders. With "hold" it then waits for a gate that never opens.
_LEAVE_BEHIND = r"""
import os, subprocess, sys, time
marker, hold = sys.argv[1], sys.argv[2] == "hold"
secret = os.environ["HF_TOKEN"]
subprocess.run(["setsid", "-f", "env", "-i", "HF_TOKEN=" + secret, sys.executable, "-c",
                "import time; time.sleep(600)", marker + "-daemon"], check=True)
for folder in ("/tmp", "/dev/shm"):
    fd = os.open(os.path.join(folder, marker + "-left"), os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, secret.encode())
    os.close(fd)
with open(os.path.join(os.environ["GPULAYER_OUTPUT_DIR"], "secret.txt"), "w") as f:
    f.write(secret)
print("UID", os.getuid(), flush=True)
while hold:
    time.sleep(1)
"""
# The next job looks for all of that: the daemon (and its environment), the temp files, the
# earlier attempt's folder.
_LOOK_FOR_LEFTOVERS = r"""
import json, os, sys
marker, earlier = sys.argv[1], sys.argv[2]
report = {"uid": os.getuid(), "tmpdir": os.environ.get("TMPDIR"), "seen": False, "read": {}}
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if (marker + "-daemon").encode() not in f.read():
                continue
    except OSError:
        continue
    report["seen"] = True
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            report["read"]["environ"] = f.read().decode(errors="replace")
    except OSError as exc:
        report["environ_error"] = exc.strerror
for path in (f"/tmp/{marker}-left", f"/dev/shm/{marker}-left", earlier):
    try:
        with open(path) as f:
            report["read"][path] = f.read()
    except OSError as exc:
        report[path] = exc.strerror
print("SPY " + json.dumps(report), flush=True)
"""


def printed(client: ControlClient, job_id: str, prefix: str) -> str:
    (line,) = [x["text"] for x in client.logs(job_id)["lines"] if x["text"].startswith(prefix)]
    return str(line).removeprefix(prefix).strip()


def end_leftovers(marker: str) -> None:
    """What a test's jobs left, should the worker not have ended or removed it."""
    for pid in processes_with(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for folder in ("/tmp", "/dev/shm"):
        Path(folder, f"{marker}-left").unlink(missing_ok=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="running jobs as other uids needs root")
def test_a_uid_comes_back_to_the_pool_without_what_its_last_attempt_left(
    cluster_factory: Any, tmp_path: Path, open_work_dir: Path
) -> None:
    python = shutil.which("python3", path="/usr/bin:/bin")
    assert python
    cluster = cluster_factory(0)
    client = cluster.client
    # Without a cgroup the worker only finds the processes that carry the attempt's tag.
    worker = WorkerProcess(
        cluster.server.url, cluster.worker_token, tmp_path / "ranged", "ranged",
        wrapper=without_cgroup_v2(),
    ).start(0.5, "--run-as-range", "61020-61029", "--work-dir", str(open_work_dir))  # fmt: skip
    cluster.workers.append(worker)
    wait_for_workers(client, 1)
    marker = f"gl-left-{secrets.token_hex(4)}"
    token_value = f"hf_{secrets.token_hex(12)}"
    try:
        first_spec = command_job([python, "-c", _LEAVE_BEHIND, marker, "go"])
        first_spec["env"] = {"HF_TOKEN": token_value}
        first = submit(client, first_spec)
        assert wait_for_job(client, first, {"succeeded", "failed"})["state"] == "succeeded"
        uid = int(printed(client, first, "UID "))
        earlier = open_work_dir / first / "attempt-1" / "output" / "secret.txt"
        second = submit(
            client, command_job([python, "-c", _LOOK_FOR_LEFTOVERS, marker, str(earlier)])
        )
        done = wait_for_job(client, second, {"succeeded", "failed"})
        assert done["state"] == "succeeded", (
            str(done["attempts"]),
            client.logs(second)["lines"][-5:],
        )
        report = json.loads(printed(client, second, "SPY "))
        assert report["uid"] == uid and 61020 <= uid <= 61029, report  # the same uid again
        assert report["read"] == {} and token_value not in json.dumps(report), report
        assert report["seen"] is False, report  # the daemon was ended with its attempt
        for leftover in (f"/tmp/{marker}-left", f"/dev/shm/{marker}-left"):
            assert report[leftover] == "No such file or directory", report
            assert not Path(leftover).exists()
        # The earlier attempt's folder went once its outputs were stored.
        assert report[str(earlier)] == "No such file or directory", report
        assert processes_with(marker + "-daemon") == []
        # Its own temp folder lies in its own attempt's folder.
        assert report["tmpdir"] == str(open_work_dir / second / "attempt-1" / "tmp"), report
    finally:
        end_leftovers(marker)


@pytest.mark.skipif(os.geteuid() != 0, reason="running jobs as other uids needs root")
def test_a_worker_restarted_after_kill_9_takes_back_what_its_uids_held(
    cluster_factory: Any, tmp_path: Path, open_work_dir: Path
) -> None:
    python = shutil.which("python3", path="/usr/bin:/bin")
    assert python
    cluster = cluster_factory(0)
    client = cluster.client
    flags = ("--run-as-range", "61040-61049", "--work-dir", str(open_work_dir))
    worker = WorkerProcess(
        cluster.server.url, cluster.worker_token, tmp_path / "phoenix", "phoenix",
        wrapper=without_cgroup_v2(),
    ).start(0.5, *flags)  # fmt: skip
    cluster.workers.append(worker)
    (first_life,) = wait_for_workers(client, 1)
    marker = f"gl-life-{secrets.token_hex(4)}"
    token_value = f"hf_{secrets.token_hex(12)}"
    try:
        first_spec = command_job([python, "-c", _LEAVE_BEHIND, marker, "hold"])
        first_spec["env"] = {"HF_TOKEN": token_value}
        first = submit(client, first_spec)
        wait_until(lambda: processes_with(marker + "-daemon"), 30, "the daemon is up")
        (main,) = [p for p in processes_with(marker) if p not in processes_with(marker + "-daemon")]
        uid = Path(f"/proc/{main}").stat().st_uid
        attempt_dir = open_work_dir / first / "attempt-1"
        wait_until(lambda: (attempt_dir / "output" / "secret.txt").exists(), 30, "its secret file")
        assert worker.process is not None
        worker.signal(signal.SIGKILL)
        worker.process.wait(15)
        # The sentinel ends the tagged job; the daemon with a wiped environment is out of reach.
        wait_until(lambda: main not in processes_with(marker), 15, "the job outlived its worker")
        worker.start(0.5, *flags)
        log = worker.home / "worker.log"
        wait_until(lambda: log.read_text().count(" joined ") == 2, 30, "it did not join again")
        assert [w["id"] for w in client.workers()] == [first_life["id"]]  # as itself
        earlier = attempt_dir / "output" / "secret.txt"
        second_spec = command_job([python, "-c", _LOOK_FOR_LEFTOVERS, marker, str(earlier)])
        second = submit(client, second_spec)
        done = wait_for_job(client, second, {"succeeded", "failed"})
        assert done["state"] == "succeeded", (
            str(done["attempts"]),
            client.logs(second)["lines"][-5:],
        )
        # The killed life's last claim, still open on the server, took nothing of the new life's.
        assert len(done["attempts"]) == 1, done["attempts"]
        report = json.loads(printed(client, second, "SPY "))
        assert report["uid"] == uid, report  # the lowest uid of the range, as in the first life
        assert report["read"] == {} and token_value not in json.dumps(report), report
        assert report["seen"] is False, report
        # The killed life's attempt folder was taken back, then removed as an ended one.
        assert report[str(earlier)] == "No such file or directory", report
        assert processes_with(marker + "-daemon") == []
        assert not attempt_dir.exists()
        assert "Traceback" not in log.read_text(), log.read_text()[-2000:]
    finally:
        end_leftovers(marker)


def test_run_as_range_is_checked_before_the_worker_starts(tmp_path: Path) -> None:
    token_file = tmp_path / "join.token"
    token_file.write_text("gl_x\n")
    base = ["worker", "start", "--server", "http://127.0.0.1:9", "--token-file", str(token_file)]
    for bad, why in [
        ("10", "--run-as-range: FIRST-LAST"),
        ("20-10", "--run-as-range: FIRST-LAST"),
        ("0-10", "--run-as-range: uid 0"),
    ]:
        result = cli(*base, "--run-as-range", bad)
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().startswith(f"error: {why}"), result.stderr
        assert "Traceback" not in result.stderr
    both = cli(*base, "--run-as", "nobody", "--run-as-range", "61000-61001")
    assert both.returncode == 2 and "--run-as-range" in both.stderr


def test_a_revoked_worker_ends_its_attempt_at_once_and_exits_with_one_line(
    cluster_factory: Any, tmp_path: Path
) -> None:
    cluster = cluster_factory(2)
    client = cluster.client
    marker = f"gl-revoked-{secrets.token_hex(4)}"
    ledger = tmp_path / "ledger"
    job_id = submit(client, body_job(marker, 120, ledger))
    victim = worker_named(cluster, running_on(client, job_id))
    wait_until(lambda: processes_with(marker, attempt=1), 30, "attempt 1 running")
    (worker,) = [w for w in client.workers() if w["name"] == victim.name]
    tokens = client.request("GET", "/v1/tokens", params={"all_kinds": True})
    (credential,) = [t for t in tokens if t["worker_id"] == worker["id"]]
    client.request("POST", f"/v1/tokens/{credential['id']}/revoke")
    wait_until(lambda: not processes_with(marker, attempt=1), 15, "attempt 1 outlived revocation")
    assert victim.process is not None
    assert victim.process.wait(timeout=30) == 4
    log = (victim.home / "worker.log").read_text()
    assert log.count("this worker's credential was revoked") == 1, log[-2000:]
    assert "Traceback" not in log, log[-3000:]
    job = wait_for_job(client, job_id, {"succeeded", "failed"}, timeout=90)
    assert job["state"] == "succeeded", job
    assert ledger.read_text().split() == ["2"]  # the body ran to its end once, on the retry


def test_a_restarted_worker_rejoins_as_itself_and_max_workers_counts_machines(
    cluster_factory: Any, tmp_path: Path
) -> None:
    from gpulayer.worker.containment import worker_key

    cluster = cluster_factory(0)
    admin = cluster.client
    token = admin.request("POST", "/v1/tokens", {"kind": "worker", "max_workers": 1})["token"]
    home = tmp_path / "solo"
    worker = WorkerProcess(cluster.server.url, token, home, "solo").start()
    cluster.workers.append(worker)
    (first,) = wait_for_workers(admin, 1)
    identity = home / "worker-identity.json"
    wait_until(identity.exists, 10, "no identity file")
    assert identity.stat().st_mode & 0o777 == 0o600
    assert token not in identity.read_text()
    key = worker_key(home / "worker-jobs")
    for _ in range(2):  # killed with -9, then restarted on the same home, twice
        assert worker.process is not None
        worker.signal(signal.SIGKILL)
        worker.process.wait(15)
        worker.start()
        wait_until(
            lambda: [(w["id"], w["state"]) for w in admin.workers()] == [(first["id"], "ready")],
            30,
            "the restarted worker did not come back as itself",
        )
    wait_until(lambda: len(processes_with(key)) == 1, 15, "sentinels piled up")
    (row,) = [t for t in admin.request("GET", "/v1/tokens") if t["max_workers"] == 1]
    assert row["registered"] == 1
    log = (home / "worker.log").read_text()
    assert "Traceback" not in log, log[-2000:]
    # Another machine with the same join token is one too many: one line, no retrying.
    other = WorkerProcess(cluster.server.url, token, tmp_path / "other", "other").start()
    cluster.workers.append(other)
    assert other.process is not None and other.process.wait(timeout=30) == 4
    other_log = (tmp_path / "other" / "worker.log").read_text()
    assert "refused to let this worker join" in other_log and "Traceback" not in other_log
    assert processes_with(worker_key(tmp_path / "other" / "worker-jobs")) == []
