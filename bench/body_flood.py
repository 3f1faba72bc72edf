"""Big unauthenticated bodies against a real server: what they cost it, and its admin calls.

    python bench/body_flood.py [--floods N] [--mib M] [--rounds R] [--shape string|objects]

A real `gpulayer server` (SQLite) on loopback; N clients at once each send R JSON bodies of M MiB
with no token (one long string, or a list of small objects that a parser makes many times its
size) while an admin lists jobs every 50 ms. Printed: the server's resident memory
before and at its peak (VmHWM, from /proc), how long the floods took to be answered and with
what, and the admin calls' latency meanwhile (median and worst). No assertions. bench/faults.py
prints the same figures as rows of its table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.body_flood import MIB, json_body, rss_bytes, send, timed_call
from tests.support.servers import ADMIN_TOKEN, ServerProcess


def flood_figures(
    server: ServerProcess, *, floods: int = 4, mib: int = 64, rounds: int = 2, shape: str = "string"
) -> dict[str, float]:
    assert server.process is not None
    pid = server.process.pid
    body = json_body(mib * MIB, shape)
    server.client().jobs(limit=1)
    before = rss_bytes(pid)
    peak_before = rss_bytes(pid, "VmHWM")
    answers: list[tuple[int, float]] = []
    latencies: list[float] = []
    done = threading.Event()

    def flood() -> None:
        for _ in range(rounds):
            sent = send(server.host, server.port, "POST", "/v1/jobs", body,
                        {"Content-Type": "application/json"}, whole=True)  # fmt: skip
            answers.append((sent.status, sent.answered_s))

    def admin() -> None:
        while not done.is_set():
            latencies.append(timed_call(server.host, server.port, ADMIN_TOKEN))
            done.wait(0.05)

    watcher = threading.Thread(target=admin)
    watcher.start()
    started = time.perf_counter()
    threads = [threading.Thread(target=flood) for _ in range(floods)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    done.set()
    watcher.join()
    return {
        "rss_before_mib": before / MIB,
        "rss_peak_mib": max(rss_bytes(pid, "VmHWM"), peak_before) / MIB,
        "peak_growth_mib": (rss_bytes(pid, "VmHWM") - peak_before) / MIB,
        "flood_s": elapsed,
        "answer_median_s": statistics.median(a for _, a in answers),
        "refused_401": sum(1 for status, _ in answers if status == 401),
        "bodies": len(answers),
        "admin_median_ms": statistics.median(latencies) * 1000,
        "admin_max_ms": max(latencies) * 1000,
        "admin_calls": len(latencies),
    }


def body_flood(database_url: str | None) -> dict[str, float]:
    """bench/faults.py's rows: a fresh server's peak memory and its admin calls' worst latency
    while 4 clients send 64 MiB unauthenticated bodies."""
    import shutil

    base = Path(tempfile.mkdtemp(prefix="gpulayer-bench-flood-"))
    server = ServerProcess(base / "server", database_url=database_url).start()
    try:
        figures = flood_figures(server)
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
    return {
        "flood_rss_before_mib": figures["rss_before_mib"],
        "flood_rss_peak_mib": figures["rss_peak_mib"],
        "flood_admin_max_ms": figures["admin_max_ms"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--floods", type=int, default=4)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--shape", choices=["string", "objects"], default="string")
    args = parser.parse_args()
    server = ServerProcess(Path(tempfile.mkdtemp(prefix="gpulayer-bench-flood-")) / "server")
    server.start()
    try:
        figures = flood_figures(
            server, floods=args.floods, mib=args.mib, rounds=args.rounds, shape=args.shape
        )
    finally:
        server.stop()
    print(
        f"{args.floods} clients x {args.rounds} unauthenticated {args.mib} MiB JSON bodies ({args.shape})"
    )
    for key, value in figures.items():
        print(f"  {key:<20}{value:>10.1f}")


if __name__ == "__main__":
    main()
