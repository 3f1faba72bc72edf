"""Submit -> running latency on an idle remote worker, measured side by side in one run.

    python bench/remote_latency.py [--repeat N]

Starts a real `gpulayer server` and one `gpulayer worker start` on loopback, then times, per job,
the submit call, submit -> running (the worker has started the attempt) and submit -> finished for
`true`, next to a bare `true` for scale. No assertions: read the numbers.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.servers import ServerProcess, WorkerProcess, wait_for_workers


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="gpulayer-bench-remote-"))
    server = ServerProcess(base / "server", heartbeat_timeout=30).start()
    worker = None
    try:
        client = server.client()
        token = client.request("POST", "/v1/tokens", {"kind": "worker"})["token"]
        worker = WorkerProcess(server.url, token, base / "worker", "bench").start(
            heartbeat_seconds=5
        )
        wait_for_workers(client, 1)
        spec = {
            "workload": {"kind": "command", "command": ["true"]},
            "placement": {"target": "remote"},
        }
        submit_s, running_s, finished_s = [], [], []
        for _ in range(args.repeat):
            started = time.perf_counter()
            job = client.submit(spec)
            submit_s.append(time.perf_counter() - started)
            seen_running = None
            while True:
                state = client.job(job["id"])
                if (
                    seen_running is None
                    and state["attempts"]
                    and state["attempts"][0]["started_at"]
                ):
                    seen_running = time.perf_counter() - started
                if state["state"] in ("succeeded", "failed", "cancelled"):
                    finished_s.append(time.perf_counter() - started)
                    running_s.append(seen_running if seen_running is not None else finished_s[-1])
                    break
                time.sleep(0.005)
        bare = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            subprocess.run(["true"], check=True)
            bare.append(time.perf_counter() - started)
    finally:
        if worker is not None:
            worker.stop()
        server.stop()

    def row(name: str, samples: list[float]) -> str:
        return f"{name:<40}{statistics.median(samples) * 1000:>10.1f}{max(samples) * 1000:>10.1f}"

    print(f"{'what (ms)':<40}{'median':>10}{'max':>10}")
    print(row("bare `true`", bare))
    print(row("submit call (HTTP, validate, persist)", submit_s))
    print(row("submit -> running on an idle worker", running_s))
    print(row("submit -> finished", finished_s))


if __name__ == "__main__":
    main()
