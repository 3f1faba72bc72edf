"""Many jobs through one request, workers woken one by one, bundles kept by content.

In process against a real SQLite store (the service's own doors), then through a real server
and worker on loopback (the SDK's launch_many and map)."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulayer.control.claim_poll import claim_blocking
from gpulayer.control.service import ControlService
from gpulayer.errors import SpecError, UsageError
from gpulayer.protocol.messages import Assignment, ClaimReply
from tests.integration.test_live_placement import plane, register
from tests.support.servers import (
    ADMIN_TOKEN,
    ServerProcess,
    WorkerProcess,
    wait_for_job,
    wait_for_workers,
)
from tests.unit.test_scheduler_builders import caps


def command(*argv: str, **placement: Any) -> dict[str, Any]:
    return {
        "workload": {"kind": "command", "command": list(argv)},
        "placement": {"target": "remote", **placement},
        "resources": {"cpu_cores": 0.5},
    }


def test_a_job_wakes_only_the_worker_it_was_given_to(tmp_path: Path) -> None:
    service = plane(tmp_path)
    chosen = register(service, "chosen", caps(cpu_cores=4))
    other = register(service, "other", caps(cpu_cores=4))
    got: dict[str, list[Assignment]] = {}

    def poll(worker_id: str) -> None:
        got[worker_id] = claim_blocking(service.claims, worker_id, 30.0).assignments

    threads = {w: threading.Thread(target=poll, args=(w,), daemon=True) for w in (chosen, other)}
    for thread in threads.values():
        thread.start()
    time.sleep(0.2)  # let both long-polls start waiting (each re-checks on wake anyway)
    job = service.submissions.submit(command("true", worker_ids=[chosen]))
    threads[chosen].join(10)
    assert not threads[chosen].is_alive()
    assert [a.job_id for a in got[chosen]] == [job.id]
    assert threads[other].is_alive()  # the other worker's long-poll was not woken
    service.jobs.cancel(job.id)  # a cancel wakes only the worker running the job
    assert threads[other].is_alive()
    service.submissions.submit(command("true", worker_ids=[other]))
    threads[other].join(10)
    assert not threads[other].is_alive() and len(got[other]) == 1


def test_a_cancel_ends_the_claim_long_poll_once_per_worker_life(tmp_path: Path) -> None:
    service = plane(tmp_path)
    worker = register(service, "w", caps(cpu_cores=4))
    job = service.submissions.submit(command("sleep", "300"))
    (assignment,) = claim_blocking(service.claims, worker, 5.0, with_cancels=True).assignments
    got: list[ClaimReply] = []
    poll = threading.Thread(
        target=lambda: got.append(claim_blocking(service.claims, worker, 30.0, with_cancels=True)),
        daemon=True,
    )
    poll.start()
    service.jobs.cancel(job.id)
    poll.join(10)
    assert not poll.is_alive(), "the cancel did not end the long-poll"
    assert got[0].cancel_attempts == [assignment.attempt_id] and got[0].assignments == []
    # Told once: the next poll waits it out, and a poll without signals never carries it.
    assert claim_blocking(service.claims, worker, 0.3, with_cancels=True).cancel_attempts == []
    assert claim_blocking(service.claims, worker, 0.0).assignments == []
    # The heartbeat still repeats it, should the claim reply have been lost on the way.
    reply = service.workers.heartbeat(worker, running=[assignment.attempt_id])
    assert reply.cancel_attempts == [assignment.attempt_id]


def test_one_long_poll_carries_every_assignment_up_to_capacity(tmp_path: Path) -> None:
    service = plane(tmp_path)
    worker = register(service, "w", caps(cpu_cores=2))
    service.submissions.submit_many([(command("true"), None, None) for _ in range(6)])
    found = claim_blocking(service.claims, worker, 5.0).assignments
    assert len(found) == 4  # 2 cores, half a core each
    assert claim_blocking(service.claims, worker, 0.0).assignments == []


def test_a_claim_starts_all_it_carries_in_one_write_and_each_only_once(tmp_path: Path) -> None:
    from sqlalchemy import event

    service = plane(tmp_path)
    worker = register(service, "w", caps(cpu_cores=2))
    service.submissions.submit_many([(command("true"), None, None) for _ in range(4)])
    writes: list[str] = []
    event.listen(
        service.store.engine,
        "before_cursor_execute",
        lambda _c, _k, statement, *_: (
            writes.append(statement) if statement.startswith("UPDATE attempts") else None
        ),
    )
    found = claim_blocking(service.claims, worker, 0).assignments
    assert len(found) == 4 and len(writes) == 1
    assert {a.state for a in service.store.active_attempts(worker)} == {"running"}
    assert (
        claim_blocking(service.claims, worker, 0).assignments == []
    )  # started attempts are not handed out again


def test_submit_many_is_one_transaction_in_order(tmp_path: Path) -> None:
    service = plane(tmp_path)
    register(service, "w", caps(cpu_cores=64))
    jobs = service.submissions.submit_many(
        [(command("echo", str(i)), None, None) for i in range(50)]
    )
    assert [j.spec["workload"]["command"] for j in jobs] == [["echo", str(i)] for i in range(50)]
    assert len({j.id for j in jobs}) == 50
    assert sum(1 for _ in service.store.list_jobs(limit=1000)) == 50
    assert service.store.attempts_for(jobs[0].id)  # placed by the same call


def test_one_bad_spec_refuses_the_whole_list_naming_it(tmp_path: Path) -> None:
    service = plane(tmp_path)
    bad = command("true")
    bad["resources"] = {"gpus": -1}
    with pytest.raises(SpecError) as refused:
        service.submissions.submit_many([(command("true"), None, None), (bad, None, None)])
    assert all(line.startswith("jobs[1].") for line in refused.value.lines)
    assert "resources.gpus" in str(refused.value)
    assert service.store.list_jobs() == []
    with pytest.raises(UsageError, match="bundle_id"):
        service.submissions.submit_many([(command("true"), None, "0" * 64)])
    assert service.store.list_jobs() == []


def test_a_repeated_spec_is_refused_at_every_index_and_stored_for_every_job(
    tmp_path: Path,
) -> None:
    service = plane(tmp_path)
    register(service, "w", caps(cpu_cores=64))
    bad = command("true")
    bad["resources"] = {"gpus": -1}
    with pytest.raises(SpecError) as refused:
        service.submissions.submit_many(
            [(bad, None, None), (command("true"), None, None), (bad, None, None)]
        )
    assert {line.split(".", 1)[0] for line in refused.value.lines} == {"jobs[0]", "jobs[2]"}
    same = command("echo", "x")
    reordered = dict(reversed(list(same.items())))
    jobs = service.submissions.submit_many(
        [(same, None, None), (reordered, None, None), (same, None, None)]
    )
    assert len({j.id for j in jobs}) == 3
    assert all(j.spec == jobs[0].spec for j in jobs)
    assert [j.spec["workload"]["command"] for j in jobs] == [["echo", "x"]] * 3


def _bundle_digest(service: ControlService, source: Path) -> str:
    from gpulayer.protocol.bundle import create_bundle

    upload = service.layout.root / "incoming" / "up.tar.gz"
    create_bundle(source, upload)
    return service.bundles.keep(upload)


def test_a_bundle_is_kept_once_and_dropped_with_its_last_job(tmp_path: Path) -> None:
    service = plane(tmp_path)
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text("print(1)\n")
    digest = _bundle_digest(service, source)
    assert _bundle_digest(service, source) == digest  # the same folder, the same digest
    jobs = service.submissions.submit_many([(command("true"), None, digest) for _ in range(3)])
    kept = service.bundles.path(digest)
    assert list(kept.parent.iterdir()) == [kept]
    # Each job's row names the kept file; no job has a folder of its own for it.
    assert [j.bundle_digest for j in service.store.get_jobs([j.id for j in jobs])] == [digest] * 3
    assert not service.layout.jobs_dir.exists() or list(service.layout.jobs_dir.iterdir()) == []
    for job in jobs:
        service.store.update_job(job.id, state="succeeded", finished_at=time.time())
    service.jobs.delete_jobs([jobs[0].id, jobs[1].id])
    assert kept.exists()
    service.jobs.delete_jobs([jobs[2].id])
    assert not kept.exists()


def test_a_job_stored_before_schema_10_runs_and_releases_the_bundle_in_its_folder(
    tmp_path: Path,
) -> None:
    import os

    from gpulayer.control.bundle_store import DIGEST_FILE

    service = plane(tmp_path)
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text("print(1)\n")
    digest = _bundle_digest(service, source)
    kept = service.bundles.path(digest)
    # As an older gpulayer left it: a row with has_bundle and no digest, and the job's folder
    # holding a hard link to the kept file with the digest beside it.
    old = service.store.insert_job(
        job_id="j-older",
        name="older",
        spec=command("true"),
        state="succeeded",
        target="remote",
        working_dir=None,
        has_bundle=True,
        labels={},
    )
    folder = service.layout.job_dir(old.id)
    folder.mkdir(parents=True)
    os.link(kept, service.layout.bundle_file(old.id))
    (folder / DIGEST_FILE).write_text(digest)
    (new,) = service.submissions.submit_many([(command("true"), None, digest)])
    assert service.jobs.bundle_path(old.id) == service.layout.bundle_file(old.id)
    assert service.jobs.bundle_path(new.id) == kept
    assert service.claims.source_for(service.store.get_job(old.id), on_this_machine=False) == {
        "working_dir": None,
        "has_bundle": True,
        "bundle_digest": digest,
    }
    service.jobs.delete_jobs([old.id])
    assert kept.is_file() and not folder.exists()  # the new job's row still names it
    service.store.update_job(new.id, state="succeeded", finished_at=time.time())
    service.jobs.delete_jobs([new.id])
    assert not kept.exists()


def test_a_refused_list_names_the_missing_bundle_and_keeps_nothing(tmp_path: Path) -> None:
    service = plane(tmp_path)
    missing = "e" * 64
    with pytest.raises(UsageError, match=f"^bundle_id: sha256:{missing} was not uploaded$"):
        service.submissions.submit_many(
            [(command("true"), None, None), (command("true"), None, missing)]
        )
    assert service.store.list_jobs() == []


# --- through a real server and worker ------------------------------------------------------


@contextlib.contextmanager
def server_and_worker(
    tmp_path: Path, *, heartbeat_seconds: float = 0.5, heartbeat_timeout: float = 30
) -> Iterator[tuple[ServerProcess, Any]]:
    """A team server with one worker, and an admin client of it."""
    server = ServerProcess(tmp_path / "server", heartbeat_timeout=heartbeat_timeout).start()
    worker = None
    try:
        client = server.client()
        token = client.request("POST", "/v1/tokens", {"kind": "worker"})["token"]
        worker = WorkerProcess(server.url, token, tmp_path / "worker", "w")
        worker.start(heartbeat_seconds, "--keep-attempts", "1")  # their folders are counted
        wait_for_workers(client, 1)
        yield server, client
    finally:
        if worker is not None:
            worker.stop()
        server.stop()


@pytest.mark.slow
def test_launch_many_and_map_through_a_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gpulayer as gl

    with server_and_worker(tmp_path) as (server, client):
        source = tmp_path / "src"
        source.mkdir()
        (source / "mathfns.py").write_text("def square(x):\n    return {'square': x * x}\n")
        monkeypatch.chdir(source)
        monkeypatch.syspath_prepend(str(source))
        monkeypatch.setenv("GPULAYER_SERVER", server.url)
        monkeypatch.setenv("GPULAYER_TOKEN", ADMIN_TOKEN)
        ledger = tmp_path / "ledger"
        ledger.mkdir()
        specs = [
            command("sh", "-c", f'echo {i} > {ledger}/"$GPULAYER_JOB_ID"; echo line-{i}')
            for i in range(12)
        ]
        jobs = gl.launch_many(specs)
        assert len(jobs) == 12
        ends = [job.wait(120) for job in jobs]
        assert [e["state"] for e in ends] == ["succeeded"] * 12
        assert {p.name: p.read_text().strip() for p in ledger.iterdir()} == {
            job.id: str(i) for i, job in enumerate(jobs)
        }
        assert "line-3" in jobs[3].logs()  # the last lines travelled with the outcome
        kept = list((tmp_path / "server" / "bundles").iterdir())
        assert len(kept) == 1  # one upload for twelve jobs of one source folder
        cache = list((tmp_path / "worker").rglob(".bundles/*.tar.gz"))
        assert [p.name for p in cache] == [kept[0].name]
        # Fetched once, though the twelve jobs started together: the rest waited for the cache
        # and took a copy of it, checked against its digest.
        assert len(list((tmp_path / "worker").rglob("attempt-*/source.tar.gz"))) == 1
        assert len(list((tmp_path / "worker").rglob("attempt-*/source.cached.tar.gz"))) == 11

        sys.modules.pop("mathfns", None)
        import mathfns  # type: ignore[import-not-found]

        results = gl.remote(timeout=120, target="remote")(mathfns.square).map([3, 1, 2])
        assert results == [{"square": 9}, {"square": 1}, {"square": 4}]
        assert len(list((tmp_path / "server" / "bundles").iterdir())) == 1  # same folder
        listing = json.dumps(client.jobs(limit=100))
        assert listing.count('"succeeded"') == 15


@pytest.mark.slow
def test_launch_many_from_one_folder_gives_each_job_its_own_local_inputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gpulayer as gl

    with server_and_worker(tmp_path) as (server, _client):
        source = tmp_path / "src"
        source.mkdir()
        show = (
            "import os\nprint('saw', open(os.environ['GPULAYER_INPUT_DIR'] + '/data.txt').read())"
        )
        (source / "show.py").write_text(show + "\n")
        shards = tmp_path / "shards"  # outside the folder: only the bundle carries them
        shards.mkdir()
        for name in ("first", "second"):
            (shards / f"{name}.txt").write_text(f"shard-{name}")
        monkeypatch.chdir(source)
        monkeypatch.setenv("GPULAYER_SERVER", server.url)
        monkeypatch.setenv("GPULAYER_TOKEN", ADMIN_TOKEN)
        specs = [
            {
                **command("python", "show.py"),
                "inputs": [{"artifact": str(shards / f"{name}.txt"), "path": "data.txt"}],
            }
            for name in ("first", "second")
        ]
        jobs = gl.launch_many(specs)
        ends = [job.wait(120) for job in jobs]
        assert [e["state"] for e in ends] == ["succeeded"] * 2, ends
        assert "saw shard-first" in jobs[0].logs()
        assert "saw shard-second" in jobs[1].logs()
        assert len(list((tmp_path / "server" / "bundles").iterdir())) == 2  # one per content


def test_an_array_limit_holds_how_many_of_it_run_at_once(tmp_path: Path) -> None:
    from gpulayer.control.arrays import array_members
    from gpulayer.protocol.messages import AttemptReport

    service = plane(tmp_path)
    worker = register(service, "w", caps(cpu_cores=64))
    array = array_members(command("true"), range(6), 2, "a-0123456789")
    service.submissions.submit_many([(job, None, None) for job in [*array, command("true")]])
    running = claim_blocking(service.claims, worker, 1.0).assignments

    def index(a: Assignment) -> str:
        return str(a.spec["labels"].get("gpulayer.array.index", "-"))

    assert sorted(index(a) for a in running) == ["-", "0", "1"]  # two of it, and one outside
    first = next(a for a in running if index(a) == "0")
    service.reports.finish_attempt(first.attempt_id, AttemptReport(state="succeeded", exit_code=0))
    (third,) = claim_blocking(service.claims, worker, 1.0).assignments
    assert index(third) == "2"
    members = service.jobs.array_jobs("a-0123456789")
    assert [j.labels["gpulayer.array.index"] for j in members] == [str(i) for i in range(6)]
    cancelled = service.jobs.cancel_array("a-0123456789")
    assert {j.state for j in cancelled} <= {"cancelled", "succeeded", "running"}
    assert sum(j.state == "cancelled" for j in cancelled) == 3


@pytest.mark.slow
def test_a_cancel_reaches_a_remote_worker_long_before_its_next_heartbeat(
    tmp_path: Path,
) -> None:
    # Heartbeats 30 s apart: only the claim long-poll can carry the cancel in time.
    with server_and_worker(tmp_path, heartbeat_seconds=30, heartbeat_timeout=120) as (_, client):
        worker_id = client.workers()[0]["id"]
        # Without signals=1 the claim answers as it always did: a bare list.
        assert client.request("POST", f"/v1/workers/{worker_id}/claim") == []
        asked_for_signals = client.request(
            "POST", f"/v1/workers/{worker_id}/claim", params={"signals": 1}
        )
        assert asked_for_signals == {"assignments": [], "cancel_attempts": []}
        pid_file = tmp_path / "job.pid"
        job = client.submit(command("sh", "-c", f"echo $$ > {pid_file}; exec sleep 300"))
        wait_for_job(client, job["id"], {"running"}, timeout=60)
        pid = _wait_for_pid(pid_file)
        asked = time.monotonic()
        client.cancel(job["id"])
        ended = wait_for_job(client, job["id"], {"cancelled", "failed", "succeeded"}, timeout=10)
        took = time.monotonic() - asked
        assert ended["state"] == "cancelled"
        assert took < 5, f"the cancel took {took:.1f} s to reach the worker"
        assert not _alive(pid)


def _wait_for_pid(path: Path, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text().strip() if path.exists() else ""
        if text:
            return int(text)
        time.sleep(0.05)
    raise AssertionError(f"the job never wrote {path}")


def _alive(pid: int) -> bool:
    """True while the process exists and is not a zombie awaiting its reaper."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
