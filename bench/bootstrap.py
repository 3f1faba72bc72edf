"""Bootstrap speed: SSH-reachable to worker-registered, measured side by side in one run (no
assertions; read the ratios).

    python bench/bootstrap.py [--hosts 8] [--repeat 1]

Rows: one fresh host (nothing of gpulayer on it); N fresh hosts bootstrapped at once, one
thread each, timed until the last worker is registered; and one warm host (a second job on a
host that keeps the wheelhouse). Hosts are real sshd hosts in network namespaces (as root) or
on loopback, against a real control plane; they share this machine's CPUs, so N hosts at once
compete for the same cores. The wheelhouse is built before timing starts (its cold build time
is printed too), as a controller keeps it cached between jobs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpulayer.cloud.bootstrap import BootstrapPlan, RemoteWorker, bootstrap_worker
from gpulayer.cloud.wheelhouse import Wheelhouse, build_wheelhouse
from gpulayer.ssh.session import SshSession
from gpulayer.ssh.wait import wait_for_ssh
from tests.support.servers import ServerProcess
from tests.support.sshd_hosts import SshdHost, SshdLab


def machine_busy_seconds() -> float:
    """CPU seconds every core of this machine spent not idle, since boot (/proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class Bench:
    def __init__(self, base: Path, wheelhouse: Wheelhouse) -> None:
        self.base = base
        self.wheelhouse = wheelhouse
        self.lab = SshdLab.create(base / "lab")
        self.server = ServerProcess(base / "server").start()
        self.client = self.server.client()
        self.workers: list[tuple[RemoteWorker, SshSession]] = []
        self._count = 0
        self._lock = threading.Lock()

    def plan(self, install_root: Path, name: str) -> BootstrapPlan:
        token = self.client.request("POST", "/v1/tokens", {"kind": "worker"})["token"]
        return BootstrapPlan(
            install_dir=str(install_root / name),
            control_plane_port=self.server.port,
            worker_token=token,
            worker_name=name,
            labels={},
            provider="ssh",
            region="bench",
            deadman_action=f"record:{self.base / 'deadman.jsonl'}",
            python=sys.executable,
            heartbeat_seconds=1.0,
        )

    def fresh_hosts(self, count: int) -> list[tuple[SshdHost, SshSession, Path]]:
        hosts = self.lab.add_hosts(count)
        ready = []
        for host in hosts:
            with self._lock:
                self._count += 1
                root = self.base / f"root{self._count}"
            ready.append((host, wait_for_ssh(host.target(), 15), root))
        return ready

    def bootstrap(
        self, session: SshSession, plan: BootstrapPlan, phases: list[tuple[float, str]] | None
    ) -> None:
        started = time.perf_counter()

        def note(line: str) -> None:
            if phases is not None:
                phases.append((time.perf_counter() - started, line))

        worker = bootstrap_worker(session, plan, self.wheelhouse, note, timeout=300)
        self.workers.append((worker, session))
        while not any(
            w["id"] == worker.worker_id and w["state"] == "ready" for w in self.client.workers()
        ):
            time.sleep(0.02)

    def one(self, phases: list[tuple[float, str]] | None = None) -> float:
        [(host, session, root)] = self.fresh_hosts(1)
        plan = self.plan(root, f"one-{host.name}")
        started = time.perf_counter()
        self.bootstrap(session, plan, phases)
        return time.perf_counter() - started

    def many(self, count: int) -> tuple[float, float, float]:
        """Wall seconds, this process's CPU seconds, and the whole machine's busy CPU seconds
        (every host's python, sshd, the control plane) while ``count`` hosts bootstrap."""
        hosts = self.fresh_hosts(count)
        plans = [self.plan(root, f"many-{host.name}") for host, _, root in hosts]
        barrier = threading.Barrier(count + 1)
        errors: list[BaseException] = []

        def run(session: SshSession, plan: BootstrapPlan) -> None:
            barrier.wait()
            try:
                self.bootstrap(session, plan, None)
            except BaseException as exc:
                errors.append(exc)

        threads = [
            threading.Thread(target=run, args=(session, plan))
            for (_, session, _), plan in zip(hosts, plans, strict=True)
        ]
        for thread in threads:
            thread.start()
        barrier.wait()
        started, cpu, busy = time.perf_counter(), time.process_time(), machine_busy_seconds()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        cpu, busy = time.process_time() - cpu, machine_busy_seconds() - busy
        if errors:
            raise errors[0]
        return elapsed, cpu, busy

    def warm(self) -> float:
        [(host, session, root)] = self.fresh_hosts(1)
        self.bootstrap(session, self.plan(root, f"first-{host.name}"), None)
        plan = self.plan(root, f"second-{host.name}")
        started = time.perf_counter()
        self.bootstrap(session, plan, None)
        return time.perf_counter() - started

    def close(self) -> None:
        try:
            for worker, _ in self.workers:
                worker.stop(grace_seconds=2)
                worker.cleanup()
        finally:
            for session in {id(s): s for _, s in self.workers}.values():
                session.close()
            self.server.stop()
            self.lab.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=8, help="hosts bootstrapped at once")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each row (median)")
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="gpulayer-bench-bootstrap-"))
    started = time.perf_counter()
    wheelhouse = build_wheelhouse(base / "wheelhouse-cache")
    cold_build = time.perf_counter() - started
    started = time.perf_counter()
    build_wheelhouse(base / "wheelhouse-cache")
    cached_build = time.perf_counter() - started
    size = sum(w.size for w in wheelhouse.files) / 2**20

    bench = Bench(base, wheelhouse)
    try:
        phases: list[tuple[float, str]] = []
        one = statistics.median(bench.one(phases if i == 0 else None) for i in range(args.repeat))
        runs = sorted(bench.many(args.hosts) for _ in range(args.repeat))
        many, controller_cpu, busy = runs[len(runs) // 2]
        warm = statistics.median(bench.warm() for _ in range(args.repeat))
    finally:
        bench.close()
        shutil.rmtree(base, ignore_errors=True)

    print(
        f"hosts: sshd in {bench.lab.mode} mode; wheelhouse {len(wheelhouse.files)} wheels, "
        f"{size:.1f} MiB (build {cold_build:.2f} s cold, {cached_build * 1000:.0f} ms cached)"
    )
    print()
    print(f"{'SSH-reachable -> worker registered':<44}{'seconds':>10}{'ratio':>10}")
    print(f"{'1 fresh host':<44}{one:>10.2f}{1:>10.2f}")
    print(f"{f'{args.hosts} fresh hosts at once':<44}{many:>10.2f}{many / one:>10.2f}")
    print(f"{'1 warm host (wheels already there)':<44}{warm:>10.2f}{warm / one:>10.2f}")
    cores = len(os.sched_getaffinity(0))
    print()
    print(
        f"{args.hosts} hosts at once: the machine was busy {busy:.1f} CPU-seconds on {cores} "
        f"cores, so no schedule finishes under {busy / cores:.1f} s here; this process (the "
        f"controller side: SSH, SFTP, tunnels) used {controller_cpu:.1f} CPU-seconds"
    )
    print()
    print("phases of the first fresh host (seconds since the call):")
    for at, line in phases:
        if line.startswith("gpulayer-bootstrap:"):
            print(f"  {at:6.2f}  {line[len('gpulayer-bootstrap: ') :]}")


if __name__ == "__main__":
    main()
