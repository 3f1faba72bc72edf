"""Schedule firing, measured side by side in one run (no assertions; read the figures).

    python bench/schedules.py [--window SECONDS] [--idle SECONDS]

Each row runs a fresh local control plane (the on-demand one, SQLite) and reports how late
ticks were decided: the decision's time minus the tick's, p50 and p99 over the window. Every
tick creates a job that fails at once as unschedulable (a remote target with no worker), so
what is measured is the firing loop and the store, not job execution.

- Scale: N active schedules, of which (up to) 10 fire every 2 s and the rest once a day: what
  holding many schedules costs the ones that fire.
- Burst: all N schedules fire every 10 s (offsets spread over the 10 s): N/10 ticks a second.
- Idle: the control plane's CPU share (its user+system CPU time over wall time) with no
  schedule and with 1,000 schedules whose next tick lies beyond the window.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PERIOD = 10


def job() -> dict[str, Any]:
    return {
        "workload": {"kind": "command", "command": ["true"]},
        "placement": {"target": "remote", "on_unschedulable": "fail"},
    }


class Plane:
    """A fresh local control plane in its own home."""

    def __init__(self) -> None:
        from gpulayer.sdk.connection import local_control_plane
        from gpulayer.sdk.schedule_client import ScheduleClient

        self.home = Path(tempfile.mkdtemp(prefix="gpulayer-bench-schedules-"))
        os.environ["GPULAYER_HOME"] = str(self.home)
        self.client = local_control_plane()
        self.client.workers()  # the local worker is up: start-up work is over
        self.pid = int(self.client.health()["pid"])
        self.schedules = ScheduleClient(self.client)

    def add(self, count: int, cron: Any) -> None:
        for i in range(count):
            expression = cron(i) if callable(cron) else cron
            self.schedules.apply({"name": f"s{i:04d}", "cron": expression, "job": job()})

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def lateness(self, start: float, end: float) -> list[float]:
        with sqlite3.connect(f"file:{self.home / 'state.db'}?mode=ro", uri=True) as conn:
            rows = conn.execute(
                "SELECT created_at - tick FROM schedule_runs WHERE manual = 0 AND tick >= ? "
                "AND tick < ?",
                (start, end),
            ).fetchall()
        return [float(r[0]) for r in rows]

    def close(self) -> None:
        from tests.support.daemon import stop_local_control_plane

        stop_local_control_plane(self.home)
        shutil.rmtree(self.home, ignore_errors=True)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def lateness_row(count: int, firing: int, cron: str, window: float) -> tuple[int, list[float]]:
    plane = Plane()
    try:
        plane.add(count, lambda i: cron.format(offset=i % PERIOD) if i < firing else "0 4 * * *")
        time.sleep(PERIOD)  # every firing schedule has fired: the window starts warm
        start = time.time()
        time.sleep(window)
        end = time.time()
        time.sleep(2)  # ticks at the window's end get decided
        late = plane.lateness(start, end)
    finally:
        plane.close()
    return len(late), late


def print_rows(title: str, rows: list[tuple[int, int, float]], cron: str, window: float) -> None:
    print(title)
    print(
        f"{'schedules':>10} {'firing':>7} {'ticks':>7} {'expected':>9} {'p50 ms':>8} "
        f"{'p99 ms':>8} {'max ms':>8}"
    )
    for count, firing, per_second in rows:
        ticks, late = lateness_row(count, firing, cron, window)
        p50, p99 = percentile(late, 0.5) * 1000, percentile(late, 0.99) * 1000
        worst = max(late, default=float("nan")) * 1000
        print(
            f"{count:>10} {firing:>7} {ticks:>7} {per_second * window:>9.0f} {p50:>8.1f} "
            f"{p99:>8.1f} {worst:>8.1f}",
            flush=True,
        )


def idle_share(count: int, seconds: float) -> float:
    plane = Plane()
    try:
        plane.add(count, "0 4 1 1 *")  # next tick months away
        time.sleep(2)
        before, started = plane.cpu_seconds(), time.monotonic()
        time.sleep(seconds)
        used, wall = plane.cpu_seconds() - before, time.monotonic() - started
    finally:
        plane.close()
    return used / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=30.0, help="seconds measured per row")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of idle measured")
    args = parser.parse_args()
    os.environ.setdefault("GPULAYER_IDLE_SECONDS", "600")
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs\n")
    scale = [(1, 1, 0.5), (100, 10, 5.0), (1000, 10, 5.0)]
    print_rows("scale: 10 firing every 2 s, the rest daily", scale, "*/2 * * * * *", args.window)
    burst = [(100, 100, 10.0), (1000, 1000, 100.0)]
    print_rows(
        f"\nburst: all firing every {PERIOD} s",
        burst,
        f"{{offset}}/{PERIOD} * * * * *",
        args.window,
    )
    print(f"\ncontrol plane idle CPU share over {args.idle:.0f} s", flush=True)
    baseline = idle_share(0, args.idle)
    loaded = idle_share(1000, args.idle)
    print(f"{'no schedule':>16}: {baseline * 100:6.2f} %")
    print(f"{'1,000 schedules':>16}: {loaded * 100:6.2f} %  ({loaded / baseline:.2f}x)")
    print(f"(load average at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
