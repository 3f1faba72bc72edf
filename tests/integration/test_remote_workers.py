"""A server and workers as separate processes on loopback: placement, faults, restarts, scale."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gpulayer.errors import ForbiddenError, UsageError
from gpulayer.protocol.client import ControlClient, Unauthorized
from tests.support.cluster import command_job, submit
from tests.support.servers import (
    ServerProcess,
    WorkerProcess,
    postgres_bin,
    postgres_cluster,
    wait_for_job,
    wait_for_workers,
)


def test_jobs_run_on_the_worker_their_labels_pick(
    cluster_factory: Any, database_url: str | None
) -> None:
    cluster = cluster_factory(3, [{"pool": "a"}, {"pool": "b"}, {"pool": "c"}], database_url)
    client = cluster.client
    job_id = submit(
        client, command_job(["python", "-c", "print('hello remote')"], worker_labels={"pool": "b"})
    )
    job = wait_for_job(client, job_id, {"succeeded", "failed"})
    assert job["state"] == "succeeded", job
    assert job["attempts"][0]["worker_name"] == "w1"
    assert job["attempts"][0]["worker_id"].startswith("w-")
    lines = client.logs(job_id)["lines"]
    assert any(line["text"].strip() == "hello remote" for line in lines)
    workers = client.workers()
    assert {w["name"] for w in workers} == {"w0", "w1", "w2"}
    assert all(w["capabilities"]["cpu_cores"] >= 1 for w in workers)


def test_tokens_are_required_and_worker_tokens_only_work(cluster_factory: Any) -> None:
    cluster = cluster_factory(1)
    anonymous = ControlClient(cluster.server.url, "wrong-token")
    with pytest.raises(Unauthorized):
        anonymous.jobs()
    as_worker = ControlClient(cluster.server.url, cluster.worker_token)
    with pytest.raises(Unauthorized):
        as_worker.jobs()
    with pytest.raises(Unauthorized):
        as_worker.submit(command_job(["true"]))
    # A join token registers workers and does nothing else, not even a heartbeat.
    with pytest.raises(ForbiddenError):
        as_worker.request("POST", "/v1/workers/none/heartbeat", {"running": []})


def test_unschedulable_fail_rejects_and_queue_says_why(cluster_factory: Any) -> None:
    cluster = cluster_factory(2, [{"pool": "a"}, {"pool": "b"}])
    client = cluster.client
    before = len(client.jobs())
    with pytest.raises(UsageError) as rejected:
        client.submit(command_job(["true"], worker_labels={"pool": "gpu"}, on_unschedulable="fail"))
    said = str(rejected.value)
    assert "placement: unschedulable" in said
    assert "w0" in said and "w1" in said and "pool=gpu" in said
    assert len(client.jobs()) == before  # refused, not kept
    waiting = submit(client, command_job(["true"], worker_labels={"pool": "gpu"}))
    job = client.job(waiting)
    assert job["state"] == "queued"
    assert any("pool=gpu" in reason for reason in job["waiting_for"])
    # A worker that fits joins: the queued job starts.
    cluster.add_worker("w9", {"pool": "gpu"})
    assert wait_for_job(client, waiting, {"succeeded", "failed"})["state"] == "succeeded"


def test_remote_falls_back_to_the_next_target(cluster_factory: Any) -> None:
    client = cluster_factory(1, [{"pool": "a"}]).client
    with pytest.raises(UsageError) as refused:
        client.submit(
            command_job(["true"], worker_labels={"pool": "zzz"}, fallback_targets=["cloud"])
        )
    assert "tried remote, cloud" in str(refused.value)
    assert "no cloud provider" in str(refused.value)


def test_killed_worker_mid_job_the_job_finishes_elsewhere(
    cluster_factory: Any, tmp_path: Path
) -> None:
    cluster = cluster_factory(2)
    client = cluster.client
    started = tmp_path / "started"
    script = (
        "import os, sys, time, pathlib; "
        f"p = pathlib.Path({str(started)!r}); p.mkdir(exist_ok=True); "
        "(p / os.environ['GPULAYER_ATTEMPT']).write_text(str(os.getpid())); "
        "time.sleep(3 if os.environ['GPULAYER_ATTEMPT'] == '1' else 0); print('done on attempt', os.environ['GPULAYER_ATTEMPT'])"
    )
    spec = command_job(["python", "-c", script])
    spec["retry"] = {"max_attempts": 2, "retry_on": ["worker_lost"]}
    job_id = submit(client, spec)
    deadline = time.monotonic() + 30
    while not (started / "1").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    first = client.job(job_id)["attempts"][0]["worker_name"]
    victim = next(w for w in cluster.workers if w.name == first)
    victim.kill_everything()
    job = wait_for_job(client, job_id, {"succeeded", "failed"}, timeout=60)
    assert job["state"] == "succeeded", job
    attempts = job["attempts"]
    assert [a["state"] for a in attempts] == ["failed", "succeeded"]
    assert attempts[0]["reason"] == "worker_lost"
    assert attempts[1]["worker_name"] != first
    lost = [w for w in client.workers() if w["name"] == first]
    assert lost[0]["state"] == "lost"


def test_lost_worker_without_retry_fails_with_worker_lost(cluster_factory: Any) -> None:
    cluster = cluster_factory(1)
    client = cluster.client
    job_id = submit(client, command_job(["sleep", "30"]))
    wait_for_job(client, job_id, {"running"})
    time.sleep(0.5)
    cluster.workers[0].kill_everything()
    job = wait_for_job(client, job_id, {"failed", "succeeded"}, timeout=30)
    assert job["state"] == "failed" and job["reason"] == "worker_lost"


def test_a_job_lost_with_its_worker_keeps_the_reports_its_log_carried(
    cluster_factory: Any,
) -> None:
    """The worker died without a word: what the job reported before is read back from its log."""
    cluster = cluster_factory(1)
    client = cluster.client
    script = (
        "import os, time\n"
        "os.environ['RANK'] = '0'\n"
        "from gpulayer.sdk import train\n"
        "for step in range(1, 4): train.report({'step': step, 'loss': 1 / step})\n"
        "print('not a report: gpulayer.train.report {}', flush=True)\n"
        "time.sleep(60)\n"
    )
    job_id = submit(client, command_job(["python", "-c", script]))

    def reported() -> bool:
        lines = [line["text"] for line in client.logs(job_id)["lines"]]
        return sum(text.startswith("gpulayer.train.report") for text in lines) >= 3

    deadline = time.monotonic() + 30
    while not reported():
        assert time.monotonic() < deadline, "the job's three reports never reached the log"
        time.sleep(0.1)
    cluster.workers[0].kill_everything()
    job = wait_for_job(client, job_id, {"failed", "succeeded"}, timeout=30)
    assert (job["state"], job["reason"]) == ("failed", "worker_lost")
    assert [r["step"] for r in job["result"]["metrics"]] == [1, 2, 3]


def test_a_lost_worker_that_returns_is_fenced(cluster_factory: Any, tmp_path: Path) -> None:
    cluster = cluster_factory(2)
    client = cluster.client
    marks = tmp_path / "marks"
    marks.mkdir()
    script = (
        "import os, time, pathlib; a = os.environ['GPULAYER_ATTEMPT']; "
        f"d = pathlib.Path({str(marks)!r}); (d / ('start-' + a)).touch(); "
        "time.sleep(4 if a == '1' else 0); (d / ('end-' + a)).touch()"
    )
    spec = command_job(["python", "-c", script])
    spec["retry"] = {"max_attempts": 2}
    job_id = submit(client, spec)
    deadline = time.monotonic() + 30
    while not (marks / "start-1").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    first = client.job(job_id)["attempts"][0]["worker_name"]
    frozen = next(w for w in cluster.workers if w.name == first)
    frozen.signal(signal.SIGSTOP)  # silent, but alive: exactly what a network partition looks like
    job = wait_for_job(client, job_id, {"succeeded", "failed"}, timeout=30)
    frozen.signal(signal.SIGCONT)
    assert job["state"] == "succeeded"
    assert [a["state"] for a in job["attempts"]] == ["failed", "succeeded"]
    time.sleep(6)  # the frozen attempt would have ended by now if it had not been fenced
    final = client.job(job_id)
    assert [a["state"] for a in final["attempts"]] == ["failed", "succeeded"]
    assert final["state"] == "succeeded"
    assert not (marks / "end-1").exists()
    assert wait_for_workers(client, 2)


def test_server_restart_loses_nothing(
    cluster_factory: Any, database_url: str | None, tmp_path: Path
) -> None:
    cluster = cluster_factory(1, None, database_url)
    client = cluster.client
    gate = tmp_path / "gate"
    running = submit(
        client,
        command_job(
            [
                "python",
                "-c",
                f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.1)\nprint('released')",
            ]
        ),
    )
    wait_for_job(client, running, {"running"})
    queued = submit(client, command_job(["true"], worker_labels={"pool": "later"}))
    cluster.server.kill()
    gate.touch()  # the job ends while the server is down
    time.sleep(1.5)
    cluster.server.start()
    client = cluster.client
    job = wait_for_job(client, running, {"succeeded", "failed"}, timeout=60)
    assert job["state"] == "succeeded", (job["reason"], job["message"], job["attempts"])
    assert any("released" in line["text"] for line in client.logs(running)["lines"])
    assert client.job(queued)["state"] == "queued"
    cluster.add_worker("later", {"pool": "later"})
    assert wait_for_job(client, queued, {"succeeded", "failed"}, timeout=60)["state"] == "succeeded"


@pytest.mark.slow
def test_many_jobs_on_many_workers_run_exactly_once(
    cluster_factory: Any, database_url: str | None, tmp_path: Path
) -> None:
    # 10 workers and 400 submissions from 20 threads share two cores here: allow slow
    # heartbeats.
    cluster = cluster_factory(10, None, database_url, heartbeat_timeout=60)
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    spec = command_job(["sh", "-c", f'echo "$GPULAYER_ATTEMPT" >> {ledger}/"$GPULAYER_JOB_ID"'])
    spec["resources"] = {"cpu_cores": 0.25}
    ids: list[str] = []
    lock = threading.Lock()

    def submitter(count: int) -> None:
        client = cluster.client
        for _ in range(count):
            job_id = submit(client, spec)
            with lock:
                ids.append(job_id)

    threads = [threading.Thread(target=submitter, args=(20,)) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(ids)) == 400
    client = cluster.client
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        live = client.jobs(limit=2000, states=["queued", "running"])
        if not live:
            break
        time.sleep(1)
    jobs = client.jobs(limit=2000)
    assert Counter(j["state"] for j in jobs) == Counter({"succeeded": 400})
    runs = {path.name: path.read_text().split() for path in ledger.iterdir()}
    assert set(runs) == set(ids)
    assert all(lines == ["1"] for lines in runs.values())
    assert all(job["attempts"] == 1 for job in jobs)


@pytest.mark.slow
def test_two_servers_on_one_postgresql_assign_each_job_once(tmp_path: Path) -> None:
    if postgres_bin() is None:
        pytest.fail("PostgreSQL is not installed: .ci/run installs it (apt-get install postgresql)")
    with postgres_cluster() as url:
        servers = [
            ServerProcess(tmp_path / f"server{i}", database_url=url, heartbeat_timeout=60).start()
            for i in range(2)
        ]
        workers: list[WorkerProcess] = []
        try:
            token = servers[0].client().request("POST", "/v1/tokens", {"kind": "worker"})["token"]
            for i in range(8):
                server = servers[i % 2]
                workers.append(
                    WorkerProcess(server.url, token, tmp_path / f"w{i}", f"w{i}").start()
                )
            wait_for_workers(servers[1].client(), 8)
            ledger = tmp_path / "ledger"
            ledger.mkdir()
            spec = command_job(
                ["sh", "-c", f'echo "$GPULAYER_ATTEMPT" >> {ledger}/"$GPULAYER_JOB_ID"']
            )
            spec["resources"] = {"cpu_cores": 0.25}
            ids: list[str] = []
            lock = threading.Lock()

            def submitter(server: ServerProcess) -> None:
                client = server.client()
                for _ in range(50):
                    job_id = submit(client, spec)
                    with lock:
                        ids.append(job_id)

            threads = [threading.Thread(target=submitter, args=(servers[i % 2],)) for i in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            client = servers[0].client()
            deadline = time.monotonic() + 300
            while (
                client.jobs(limit=1000, states=["queued", "running"])
                and time.monotonic() < deadline
            ):
                time.sleep(1)
            jobs = client.jobs(limit=1000)
            assert Counter(j["state"] for j in jobs) == Counter({"succeeded": 200})
            runs = {path.name: path.read_text().split() for path in ledger.iterdir()}
            assert set(runs) == set(ids) and all(lines == ["1"] for lines in runs.values())
            served = {w["name"] for w in servers[1].client().workers()}
            assert served == {f"w{i}" for i in range(8)}
        finally:
            for worker in workers:
                worker.stop()
            for server in servers:
                server.stop()
