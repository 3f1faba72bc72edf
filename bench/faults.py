"""Faults and bursts, measured side by side in one run, on SQLite and on PostgreSQL.

    python bench/faults.py [--jobs N] [--workers N] [--heartbeat-timeout S]

For each database: a real `gpulayer server` with workers on loopback. A worker running a job
that left a setsid daemon behind is killed with -9; the script times how long until the server
marks the worker lost (detection, bounded below by --heartbeat-timeout) and how long until no
process of the job's tree is left (the worker's sentinel). Then a burst of N short jobs from 10
submitting threads: submit rate and end-to-end rate in jobs/s, and how many ran 0 or 2+ times
(lost and doubled, both should be 0). No assertions: read the numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

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


def measure(database_url: str | None, args: argparse.Namespace) -> dict[str, float]:
    base = Path(tempfile.mkdtemp(prefix="gpulayer-bench-faults-"))
    server = ServerProcess(
        base / "server", database_url=database_url, heartbeat_timeout=args.heartbeat_timeout
    ).start()
    workers: list[WorkerProcess] = []
    try:
        client = server.client()
        token = client.request("POST", "/v1/tokens", {"kind": "worker"})["token"]
        for i in range(args.workers):
            workers.append(WorkerProcess(server.url, token, base / f"w{i}", f"w{i}").start(0.5))
        wait_for_workers(client, args.workers)
        marker = f"gl-bench-{secrets.token_hex(4)}"
        job = client.submit(
            {
                "workload": {"kind": "command", "command": ["python", "-c", _DAEMON_JOB, marker]},
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

        ledger = base / "ledger"
        ledger.mkdir()
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
    args = parser.parse_args()
    results = {}
    with databases() as found:
        for name, url in found:
            results[name] = measure(url, args)
    names = list(results)
    print(f"{'':<44}" + "".join(f"{n:>14}" for n in names))
    rows = [
        ("killed worker detected (s)", "detect_s", "{:.2f}"),
        ("killed worker -> job tree gone (s)", "tree_gone_s", "{:.2f}"),
        (f"{args.jobs}-job burst: submit (jobs/s)", "submit_rate", "{:.1f}"),
        (f"{args.jobs}-job burst: end to end (jobs/s)", "end_to_end_rate", "{:.1f}"),
        ("lost (ran 0 times)", "lost", "{:.0f}"),
        ("doubled (ran 2+ times)", "doubled", "{:.0f}"),
    ]
    for label, key, fmt in rows:
        print(f"{label:<44}" + "".join(f"{fmt.format(results[n][key]):>14}" for n in names))
    print(f"(heartbeat timeout {args.heartbeat_timeout:g} s, {args.workers} workers)")


if __name__ == "__main__":
    main()
