"""Each job runs once and its outcome is its own, with real server and worker processes.

A crashed worker takes its jobs' processes with it, a worker cut off past its heartbeat
timeout cannot overwrite what the job's next attempt did, and one job cannot act for another.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulayer.errors import ForbiddenError, StaleAttemptError
from gpulayer.protocol.client import ControlClient, Unauthorized
from tests.support.cluster import Cluster, command_job, submit
from tests.support.fault_proxy import LossyProxy
from tests.support.procs import DAEMON_PREAMBLE, processes_with, wait_until
from tests.support.servers import WorkerProcess, wait_for_job, wait_for_workers

pytestmark = pytest.mark.slow

# Forks a daemon that leaves the session (setsid, then a second fork) and sleeps; then the body:
# attempt 1 holds for HOLD seconds, a later attempt ends at once. Each finished body appends its
# attempt number to the ledger.
_BODY = DAEMON_PREAMBLE + """
hold = float(sys.argv[2]) if os.environ["GPULAYER_ATTEMPT"] == "1" else 0.2
time.sleep(hold)
out = os.environ["GPULAYER_OUTPUT_DIR"]
with open(os.path.join(out, "who.txt"), "w") as f:
    f.write(os.environ["GPULAYER_ATTEMPT"])
with open(sys.argv[3], "a") as f:
    f.write(os.environ["GPULAYER_ATTEMPT"] + "\\n")
"""


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
    wait_until(lambda: processes_with(marker, attempt=1), 30, "attempt 1 running")
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
