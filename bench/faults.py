"""Faults and bursts, measured side by side in one run, on SQLite and on PostgreSQL.

    python bench/faults.py [--jobs N] [--workers N] [--heartbeat-timeout S]

For each database: a real `gpulayer server` with workers on loopback. A worker running a job
that left a setsid daemon behind is killed with -9; the script times how long until the server
marks the worker lost (detection, bounded below by --heartbeat-timeout) and how long until no
process of the job's tree is left (the worker's sentinel). Then a burst of N short jobs from 10
submitting threads: submit rate and end-to-end rate in jobs/s, and how many ran 0 or 2+ times
(lost and doubled, both should be 0). Then submits whose first reply is lost (a proxy drops
it, the client sends the request again with its Idempotency-Key): jobs stored per job asked
for, which must be 1.00. Then 4 clients each send two 64 MiB JSON bodies without a token: the
server's resident memory before and at its peak, and the worst latency of an admin's listing
meanwhile (bench/body_flood.py alone prints more of it).

The cost of isolation, beside what runs without it (as root, needs a writable cgroup v2): the
start latency of one attempt in the worker's runner (median and p90 of N runs of /bin/true, each
in its own cgroup) run as the worker itself, as one shared --run-as user, and as a fresh uid of
its own per attempt (--run-as-range); and a third column, the whole fault and burst run again on
SQLite with every worker started with --run-as-range. No assertions: the numbers are printed,
with one line judging a fresh uid each against the worker's own (aim: within 1.2x).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.body_flood import body_flood
from tests.support.procs import DAEMON_PREAMBLE, processes_with
from tests.support.servers import (
    ServerProcess,
    WorkerProcess,
    postgres_bin,
    postgres_cluster,
    wait_for_workers,
)

_DAEMON_JOB = DAEMON_PREAMBLE + "time.sleep(600)\n"


def _when(condition: Callable[[], object], timeout: float) -> float:
    """perf_counter() at the moment condition first held (NaN if it never did)."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if condition():
            return time.perf_counter()
        time.sleep(0.01)
    return float("nan")


def measure(
    database_url: str | None, args: argparse.Namespace, *, isolated: bool = False
) -> dict[str, float]:
    base = Path(tempfile.mkdtemp(prefix="gpulayer-bench-faults-"))
    base.chmod(0o755)  # jobs of other uids reach their work dirs and the ledger below it
    server = ServerProcess(
        base / "server", database_url=database_url, heartbeat_timeout=args.heartbeat_timeout
    ).start()
    workers: list[WorkerProcess] = []
    # Jobs of other uids cannot run this interpreter (it may live under a closed home).
    python = "/usr/bin/python3" if isolated else "python"
    try:
        client = server.client()
        token = client.request("POST", "/v1/tokens", {"kind": "worker"})["token"]
        for i in range(args.workers):
            first = 62000 + 100 * i
            extra = ("--run-as-range", f"{first}-{first + 99}") if isolated else ()
            workers.append(
                WorkerProcess(server.url, token, base / f"w{i}", f"w{i}").start(0.5, *extra)
            )
        wait_for_workers(client, args.workers)
        marker = f"gl-bench-{secrets.token_hex(4)}"
        job = client.submit(
            {
                "workload": {"kind": "command", "command": [python, "-c", _DAEMON_JOB, marker]},
                "placement": {"target": "remote"},
            }
        )
        _when(lambda: len(processes_with(marker)) >= 2, 60)
        name = client.job(job["id"])["attempts"][0]["worker_name"]
        victim = next(w for w in workers if w.name == name)
        assert victim.process is not None
        killed = time.perf_counter()
        os.kill(victim.process.pid, signal.SIGKILL)
        tree_gone = _when(lambda: not processes_with(marker), 60) - killed
        detection = (
            _when(
                lambda: any(w["state"] == "lost" for w in client.workers() if w["name"] == name),
                120,
            )
            - killed
        )
        client.cancel(job["id"])

        # Outside the shared temp folders: what a job run as a uid of a range leaves there is
        # removed as its attempt ends.
        ledger = Path(tempfile.mkdtemp(prefix="gpulayer-bench-ledger-", dir=_ledger_parent(base)))
        ledger.chmod(0o1777)
        spec = {
            "workload": {
                "kind": "command",
                "command": ["sh", "-c", f'echo x >> {ledger}/"$GPULAYER_JOB_ID"'],
            },
            "placement": {"target": "remote"},
            "resources": {"cpu_cores": 0.25},
        }
        ids: list[str] = []
        lock = threading.Lock()

        def submitter(count: int) -> None:
            own = server.client()
            for _ in range(count):
                made = own.submit(spec)["id"]
                with lock:
                    ids.append(made)

        started = time.perf_counter()
        threads = [threading.Thread(target=submitter, args=(args.jobs // 10,)) for _ in range(10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        submitted = time.perf_counter() - started
        pending = set(ids)
        deadline = time.monotonic() + 900
        while pending and time.monotonic() < deadline:
            for done in client.jobs(limit=len(ids) + 10, states=["succeeded", "failed"]):
                pending.discard(done["id"])
            time.sleep(0.2)
        finished = time.perf_counter() - started
        runs = Counter({p.name: len(p.read_text().split()) for p in ledger.iterdir()})
        shutil.rmtree(ledger, ignore_errors=True)
        return {
            "detect_s": detection,
            "tree_gone_s": tree_gone,
            "submit_rate": len(ids) / submitted,
            "end_to_end_rate": len(ids) / finished,
            "lost": sum(1 for i in ids if runs.get(i, 0) == 0),
            "doubled": sum(1 for i in ids if runs.get(i, 0) > 1),
        }
    finally:
        for worker in workers:
            worker.stop()
        server.stop()


DISK_LATER_JOBS = 10


def disk_fill(database_url: str | None, later: int = DISK_LATER_JOBS) -> dict[str, float]:
    """A job fills its worker's work dir (a 48 MiB tmpfs) and exits; then ``later`` jobs, each
    with a source bundle of its own to fetch and unpack there: how many of them succeed (all
    should). NaN without root (a tmpfs mount needs it)."""
    import subprocess

    from gpulayer.protocol.bundle import create_bundle

    if os.geteuid() != 0:
        return {"disk_fill_ok": float("nan")}
    base = Path(tempfile.mkdtemp(prefix="gpulayer-bench-disk-"))
    work = base / "work"
    work.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(work)], check=True)
    server = ServerProcess(base / "server", database_url=database_url).start()
    worker = None
    try:
        client = server.client()
        token = client.request("POST", "/v1/tokens", {"kind": "worker"})["token"]
        worker = WorkerProcess(server.url, token, base / "w", "w").start(
            0.5, "--work-dir", str(work)
        )
        wait_for_workers(client, 1)
        fill = "head -c 1G /dev/zero > filler; exit 0"
        spec = {"workload": {"kind": "command", "command": ["sh", "-c", fill]},
                "placement": {"target": "remote"}}  # fmt: skip
        _finished(client, [client.submit(spec)["id"]])
        ids = []
        for i in range(later):
            source = base / f"src{i}"
            source.mkdir()
            (source / "job.py").write_text(f"# {secrets.token_hex(8)}\nprint({i})\n")
            bundle = create_bundle(source, base / f"src{i}.tar.gz").path
            job = {"workload": {"kind": "command", "command": ["python3", "job.py"]},
                   "placement": {"target": "remote"}}  # fmt: skip
            ids.append(client.submit(job, bundle_id=client.upload_bundle(bundle))["id"])
        states = _finished(client, ids)
        return {"disk_fill_ok": float(sum(state == "succeeded" for state in states))}
    finally:
        if worker is not None:
            worker.stop()
        server.stop()
        subprocess.run(["umount", "-l", str(work)], check=False)
        shutil.rmtree(base, ignore_errors=True)


LOST_REPLY_SUBMITS = 100
LOST_REPLY_LISTS = 20
LOST_REPLY_LIST_SIZE = 10


def lost_replies(database_url: str | None) -> dict[str, float]:
    """Submits whose first reply is lost on the way (a loopback proxy drops every other
    answer to POST /v1/jobs, so each request is sent twice): single jobs and lists of jobs,
    then the jobs the server stored per job asked for (1.00: each counted once)."""
    from gpulayer.protocol.client import ControlClient
    from tests.support.fault_proxy import LossyProxy
    from tests.support.servers import ADMIN_TOKEN

    base = Path(tempfile.mkdtemp(prefix="gpulayer-bench-lost-"))
    server = ServerProcess(base / "server", database_url=database_url).start()
    sent = Counter[str]()

    def every_first(method: str, path: str, _reply: bytes) -> bool:
        sent[method + path] += 1
        return (method, path) == ("POST", "/v1/jobs") and sent[method + path] % 2 == 1

    proxy = LossyProxy(server.port, every_first).start()
    try:
        client = ControlClient(proxy.url, ADMIN_TOKEN, timeout=60)
        # Labelled, as the other runs before it may have left jobs in a shared database.
        run = secrets.token_hex(4)
        spec = {"workload": {"kind": "command", "command": ["true"]},
                "placement": {"target": "remote"}, "labels": {"bench-run": run}}  # fmt: skip
        for _ in range(LOST_REPLY_SUBMITS):
            client.submit(spec)
        for _ in range(LOST_REPLY_LISTS):
            client.submit_many([{"spec": spec}] * LOST_REPLY_LIST_SIZE)
        asked = LOST_REPLY_SUBMITS + LOST_REPLY_LISTS * LOST_REPLY_LIST_SIZE
        stored = len(server.client().jobs(limit=10 * asked, labels={"bench-run": run}))
        return {"lost_reply_jobs_per_submit": stored / asked, "lost_replies": len(proxy.lost)}
    finally:
        proxy.stop()
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


def _finished(client: object, ids: list[str], timeout: float = 300) -> list[str]:
    """The jobs' end states, waited for (bounded)."""
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while len(states) < len(ids) and time.monotonic() < deadline:
        for job_id in ids:
            if job_id not in states:
                state = client.job(job_id)["state"]  # type: ignore[attr-defined]
                if state in ("succeeded", "failed", "cancelled"):
                    states[job_id] = state
        time.sleep(0.1)
    return [states.get(job_id, "unfinished") for job_id in ids]


def _ledger_parent(base: Path) -> Path:
    return Path("/run") if os.geteuid() == 0 and Path("/run").is_dir() else base


def start_latency(runs: int) -> dict[str, tuple[float, float]]:
    """(median, p90) seconds of JobRun.run() for /bin/true, per identity the job runs as."""
    import shutil
    import statistics

    from gpulayer.spec import JobSpec
    from gpulayer.worker.containment import Containment
    from gpulayer.worker.identities import UidPool, UidRange, take_back
    from gpulayer.worker.process import RunAs
    from gpulayer.worker.runner import JobRun, RunContext

    base = Path(tempfile.mkdtemp(prefix="gpulayer-bench-isolation-"))
    base.chmod(0o755)
    containment = Containment.for_worker(base / "work")
    spec = JobSpec.model_validate({"workload": {"kind": "command", "command": ["/bin/true"]}})
    shared = RunAs.lookup("nobody")
    pool = UidPool(UidRange(63000, 63099))
    modes = ("as the worker", "one shared uid", "a fresh uid each")
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    attempt = 0
    try:
        # Round robin, so that a busy moment of the machine falls on every mode alike.
        for _ in range(runs):
            for mode in modes:
                attempt += 1
                job_dir = base / f"a{attempt}"
                started = time.perf_counter()
                uid = pool.take() if mode == "a fresh uid each" else None
                run_as = None
                if uid is not None:
                    run_as = RunAs(f"gpulayer-{uid}", uid, uid, str(job_dir))
                elif mode == "one shared uid":
                    run_as = shared
                group = containment.attempt(attempt)
                context = RunContext("bench", 1, spec, job_dir, group=group, run_as=run_as)
                outcome = JobRun(context, on_log=lambda stream, text: None).run()
                all_ended = group.close()
                if uid is not None:
                    take_back(job_dir)
                    pool.release(uid, all_ended=all_ended)
                times[mode].append(time.perf_counter() - started)
                assert outcome.state == "succeeded", outcome
        found = {}
        for mode, measured in times.items():
            measured.sort()
            found[mode] = (statistics.median(measured), measured[int(len(measured) * 0.9) - 1])
    finally:
        containment.sweep()
        if containment.root is not None:
            with contextlib.suppress(OSError):
                containment.root.rmdir()
        shutil.rmtree(base, ignore_errors=True)
    return found


ISOLATION_AIM = 1.2
"""A fresh uid per attempt should start an attempt within this many times the worker's own."""


def isolation_verdict(latency: dict[str, tuple[float, float]]) -> str:
    """One line judging the median start with a fresh uid each against the worker's own."""
    ratio = latency["a fresh uid each"][0] / latency["as the worker"][0]
    verdict = "within the aim" if ratio <= ISOLATION_AIM else "OVER the aim"
    return (
        f"isolation cost: a fresh uid each starts in {ratio:.2f}x the time as the worker "
        f"(aim: within {ISOLATION_AIM:g}x): {verdict}"
    )


def isolation_possible() -> bool:
    from gpulayer.worker.containment import cgroup2_mount

    return os.geteuid() == 0 and cgroup2_mount() is not None


@contextlib.contextmanager
def databases() -> Iterator[list[tuple[str, str | None]]]:
    if postgres_bin() is None:
        yield [("sqlite", None)]
        return
    with postgres_cluster() as url:
        yield [("sqlite", None), ("postgresql", url)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--heartbeat-timeout", type=float, default=2.0)
    parser.add_argument("--start-runs", type=int, default=50)
    args = parser.parse_args()
    results = {}
    isolated = isolation_possible()
    latency = start_latency(args.start_runs) if isolated else {}
    with databases() as found:
        for name, url in found:
            results[name] = {
                **measure(url, args),
                **disk_fill(url),
                **lost_replies(url),
                **body_flood(url),
            }
    if isolated:
        results["sqlite uid/att"] = measure(None, args, isolated=True)
    names = list(results)
    if latency:
        plain = latency["as the worker"][0]
        print(f"attempt start, {args.start_runs} runs of /bin/true (s)    median      p90   ratio")
        for mode, (median, p90) in latency.items():
            print(f"  {mode:<40}{median:>8.4f} {p90:>8.4f} {median / plain:>6.2f}x")
        print(isolation_verdict(latency))
    else:
        print("(isolation columns need root and a cgroup v2 mount)")
    print(f"{'':<44}" + "".join(f"{n:>16}" for n in names))
    rows = [
        ("killed worker detected (s)", "detect_s", "{:.2f}"),
        ("killed worker -> job tree gone (s)", "tree_gone_s", "{:.2f}"),
        (f"{args.jobs}-job burst: submit (jobs/s)", "submit_rate", "{:.1f}"),
        (f"{args.jobs}-job burst: end to end (jobs/s)", "end_to_end_rate", "{:.1f}"),
        ("lost (ran 0 times)", "lost", "{:.0f}"),
        ("doubled (ran 2+ times)", "doubled", "{:.0f}"),
        (f"disk-filling job: later jobs OK (of {DISK_LATER_JOBS})", "disk_fill_ok", "{:.0f}"),
        ("submits, reply lost: jobs stored per submit", "lost_reply_jobs_per_submit", "{:.2f}"),
        ("server RSS before (MiB)", "flood_rss_before_mib", "{:.0f}"),
        ("  peak with 4x64 MiB unauth. bodies (MiB)", "flood_rss_peak_mib", "{:.0f}"),
        ("  admin call meanwhile, worst (ms)", "flood_admin_max_ms", "{:.0f}"),
    ]
    for label, key, fmt in rows:
        cells = (fmt.format(results[n].get(key, float("nan"))) for n in names)
        print(f"{label:<44}" + "".join(f"{cell:>16}" for cell in cells))
    print(f"(heartbeat timeout {args.heartbeat_timeout:g} s, {args.workers} workers)")


if __name__ == "__main__":
    main()
