"""Gangs, measured side by side in one run.

    python bench/gang.py [--sizes 1,2,4] [--repeats 2]

A real `gpulayer server` with 4 workers on loopback. For each gang size N (one process per
node), a job whose ranks only join the process group and print "ready": the time from submit
until every rank has printed it (all nodes ready), and its ratio to N = 1. Then the same 2-node
x 2-process DDP job (tests/fixtures/ddp/train.py) through gpulayer and as two plain torchrun
agents started by hand (c10d on loopback): wall time of each and gpulayer's overhead ratio.
No assertions: read the numbers.

    python bench/gang.py --hosts [--repeats 3] [--epochs 20]

On two honest hosts instead (tests/support/sshd_hosts: Debian root filesystems in their own
namespaces; needs root, iproute2 and mmdebstrap), through the ssh provider with `idle_seconds`:
a first 2-node x 1-process gang of the DDP job rents, bootstraps and sets the hosts up (torch
from a package index on the hosts' network), and is not timed; then, in turns, the same gang on
the now warm hosts (submit to the CLI's exit, no launch, no bootstrap, its setup environment
reused) and plain torchrun on the same two hosts with the same interpreter (static rendezvous,
as gpulayer starts it): wall time of each, the ratio, and where the gang's own time went.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpulayer.protocol.bundle import create_bundle
from gpulayer.protocol.client import ControlClient
from tests.support.servers import ServerProcess, WorkerProcess, free_port, wait_for_workers

DDP = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "ddp"
READY_SCRIPT = """
import os, torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
print("READY", os.environ["RANK"], flush=True)
dist.destroy_process_group()
# Leave before the interpreter's teardown, where torch 2.13's gloo can abort a finished rank.
os._exit(0)
"""
TERMINAL = ("succeeded", "failed", "cancelled")


def _spec(entrypoint: str, args: list[str], nodes: int, procs: int) -> dict[str, Any]:
    return {
        "workload": {
            "kind": "distributed",
            "entrypoint": entrypoint,
            "args": args,
            "num_workers": nodes,
            "procs_per_worker": procs,
            "comm_backend": "gloo",
            "rendezvous": {"port": free_port(), "join_timeout_seconds": 120},
        },
        "resources": {"cpu_cores": 0.1},
        "placement": {"target": "remote"},
    }


def _bundle(source: Path, scratch: Path) -> Path:
    """The job's source as a tarball; each submit uploads it anew (an upload is used once)."""
    archive = scratch / f"{source.name}.tar.gz"
    create_bundle(source, archive)
    return archive


def _run(
    client: ControlClient, spec: dict[str, Any], bundle: Path, ready: int
) -> tuple[float, float]:
    """(seconds until `ready` READY lines, seconds until the job ended) after submit."""
    start = time.perf_counter()
    job_id = client.submit(spec, bundle_id=client.upload_bundle(bundle))["id"]
    seen, after, all_ready = 0, 0, float("nan")
    while True:
        page = client.logs(job_id, after=after, wait=2)
        for line in page["lines"]:
            after = line["id"]
            if line["text"].startswith("READY"):
                seen += 1
                if seen == ready:
                    all_ready = time.perf_counter() - start
        if page["job"]["state"] in TERMINAL:
            if page["job"]["state"] != "succeeded":
                print(f"  job {job_id} {page['job']['state']}: {page['job']['message']}")
            return all_ready, time.perf_counter() - start


def _plain_torchrun(workdir: Path, args: list[str]) -> float:
    port = free_port()
    start = time.perf_counter()
    agents = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                f"--node-rank={r}",
                "--nproc-per-node=2",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                "--rdzv-id=bench",
                f"--rdzv-conf=is_host={'true' if r == 0 else 'false'}",
                "--local-addr=127.0.0.1",
                "--max-restarts=0",
                "train.py",
                *args,
            ],
            cwd=DDP,
            env={
                **__import__("os").environ,
                "GPULAYER_OUTPUT_DIR": str(workdir / f"n{r}"),
                "GPULAYER_NODE_RANK": str(r),
                # The same interface gpulayer gives its nodes: a like-for-like job.
                "GLOO_SOCKET_IFNAME": "lo",
            },
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for r in range(2)
    ]
    for agent in agents:
        agent.wait(timeout=300)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1,2,4")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--epochs", default="20")
    parser.add_argument("--hosts", action="store_true", help="on two honest hosts, warm")
    args = parser.parse_args()
    if args.hosts:
        from bench.gang_hosts import compare_on_hosts

        compare_on_hosts(args.repeats, args.epochs)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    base = Path(tempfile.mkdtemp(prefix="gpulayer-bench-gang-"))
    server = ServerProcess(base / "server", heartbeat_timeout=10).start()
    workers: list[WorkerProcess] = []
    try:
        client = server.client()
        token = client.request("POST", "/v1/tokens", {"kind": "worker"})["token"]
        for i in range(max(sizes)):
            workers.append(WorkerProcess(server.url, token, base / f"w{i}", f"w{i}").start(0.5))
        wait_for_workers(client, max(sizes))
        ready_dir = base / "ready"
        ready_dir.mkdir()
        (ready_dir / "ready.py").write_text(READY_SCRIPT)
        ready_bundle = _bundle(ready_dir, base)
        ddp_bundle = _bundle(DDP, base)
        print(f"time to all nodes ready (median of {args.repeats}; 1 process per node)")
        baseline = None
        for n in sizes:
            times = [
                _run(client, _spec("ready.py", [], n, 1), ready_bundle, n)[0]
                for _ in range(args.repeats)
            ]
            median = statistics.median(times)
            baseline = baseline or median
            print(f"  N={n}: {median:6.2f} s   ratio to N=1: {median / baseline:5.2f}x")
        print(f"2 nodes x 2 processes DDP, {args.epochs} epochs (median of {args.repeats})")
        through = statistics.median(
            _run(client, _spec("train.py", [args.epochs], 2, 2), ddp_bundle, 0)[1]
            for _ in range(args.repeats)
        )
        plain = statistics.median(
            _plain_torchrun(base / f"plain{i}", [args.epochs]) for i in range(args.repeats)
        )
        print(f"  plain torchrun (2 agents): {plain:6.2f} s")
        print(f"  through gpulayer:          {through:6.2f} s   overhead: {through / plain:5.2f}x")
    finally:
        for worker in workers:
            worker.stop()
        server.stop()


if __name__ == "__main__":
    main()
