"""gpulayer on a Slurm cluster against Slurm alone, side by side in one run (no assertions; read
the ratios).

    python bench/slurm.py [--jobs 10] [--repeat 3] [--nodes 2]

On one real Slurm 22.05 cluster it starts (tests/support/slurm_cluster: slurmctld here, compute
nodes and a login node that are hosts of their own root filesystem with their own munged and
slurmd, a shared folder mounted on every node), the same one-line
command (``python3 -c 'print("first line", flush=True)'``) goes

- through gpulayer: ``gpulayer submit --target cloud --provider slurm`` with a providers.yaml
  naming the cluster, so one ``sbatch`` allocation per job over the login node and a worker
  bootstrapped on the allocated node over SSH, started by the allocation's step;
  cold: a new allocation (``gpulayer reap`` first ends any warm one); warm: the next job in the
  allocation the cold one left idle (the slurm section's ``idle_seconds``), no new sbatch;
- through Slurm alone: ``sbatch --wrap`` of the command, on the same partition with the same
  node-level request as gpulayer's allocation (``--nodes=1 --exclusive``), so the two differ
  by what gpulayer adds, not by how densely Slurm packs them;
- as a local gpulayer job (``--target local``) in the same gpulayer home, the floor a warm
  allocation is held to.

Rows: submit to the job's first output line (median of ``--repeat``, each round on an idle
cluster), and ``--jobs`` short jobs submitted one command after another through gpulayer (in a
home of its own that keeps no allocation warm: jobs queued in Slurm do not move to an allocation
that goes idle) and through sbatch: submissions/s and jobs/s from the first submit to the last
job's end. Ratios are gpulayer's time over Slurm's (how many times longer it takes), and
the warm allocation's against the local job's. gpulayer's wheelhouse is built before timing starts, as a controller
keeps it cached. Needs root, iproute2, OpenSSH, Debian's slurm-wlm and mmdebstrap (the nodes'
root filesystem); without slurm-wlm it says so in one line and stops.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml

from tests.support.daemon import stop_local_control_plane
from tests.support.slurm_cluster import NodeShape, PartitionShape, SlurmCluster, usable
from tests.support.sshd_hosts import SshdLab

ROOT = Path(__file__).resolve().parent.parent
COMMAND = ["python3", "-c", 'print("first line", flush=True)']
PARTITION = "cpu"
ENDED = frozenset({"succeeded", "failed", "cancelled"})


def wait_for(check: Callable[[], Any], timeout: float, what: str, every: float = 0.05) -> Any:
    # Polls fast: the waits here are what is measured.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise SystemExit(f"timed out waiting for {what}")


@contextlib.contextmanager
def cluster_of(base: Path, nodes: int) -> Iterator[SlurmCluster]:
    names = tuple(f"cpu{k}" for k in range(1, nodes + 1))
    lab = SshdLab.create(base / "lab", mode="rootfs")
    cluster = SlurmCluster(
        lab,
        base / "cluster",
        tuple(NodeShape(name, cpus=2, memory_mb=2000) for name in names),
        (PartitionShape(PARTITION, names, max_time="2:00:00", default=True),),
        name="benchlab",
    )
    try:
        cluster.start()
        yield cluster
    finally:
        try:
            cluster.close()
        finally:
            lab.close()


class Gpulayer:
    """The CLI of this checkout, its embedded control plane in a home of its own whose
    providers.yaml enables only the cluster."""

    def __init__(self, home: Path, cluster: SlurmCluster, idle_seconds: float) -> None:
        self.home = home
        self.folder = home.parent / "submit"
        self.folder.mkdir(parents=True, exist_ok=True)
        home.mkdir(parents=True, exist_ok=True)
        self.env = {
            **os.environ,
            # The checkout's own provider plugins come before any installed ones.
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT), *(str(p) for p in sorted((ROOT / "providers").iterdir()))]
            ),
            "GPULAYER_HOME": str(home),
            "GPULAYER_IDLE_SECONDS": "600",
            "HTTPS_PROXY": "http://127.0.0.1:9",
            "HTTP_PROXY": "http://127.0.0.1:9",
            "NO_PROXY": "127.0.0.1,localhost",
        }
        login = cluster.login
        assert login is not None
        config = {
            "slurm": {
                "clusters": {
                    cluster.name: {
                        "login": login.address,
                        "port": login.port,
                        "user": login.user,
                        "key_file": str(login.client_key),
                        "host_key": login.host_key,
                        "partitions": [PARTITION],
                        "authorized_keys": str(cluster.on_nodes(cluster.shared_authorized_keys)),
                        "install_root": "/var/tmp/gpulayer-bench",
                        "python": "/usr/bin/python3",
                    }
                },
                "state_dir": str(home.parent / "slurm-state"),
                "idle_seconds": idle_seconds,
            },
            "gpulayer": {"deadman_seconds": 600, "ssh_cidr": f"{cluster.lab.gateway}/32"},
        }
        (home / "providers.yaml").write_text(yaml.safe_dump(config))

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "gpulayer", *args]

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args),
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.folder,
            timeout=timeout,
        )

    def submit_args(self, *extra: str, local: bool = False) -> list[str]:
        where = ["--target", "local"] if local else ["--target", "cloud", "--provider", "slurm"]
        return ["submit", *where, "--timeout", "300", *extra, "--", *COMMAND]

    def end_warm_allocations(self) -> None:
        ended = self.run("reap")
        if ended.returncode != 0:
            raise SystemExit(f"gpulayer reap failed: {ended.stderr.strip()[-500:]}")

    def wait_warm(self) -> None:
        def idle() -> bool:
            shown = self.run("instances", "--json")
            return shown.returncode == 0 and any(
                i.get("state") == "idle" for i in json.loads(shown.stdout or "[]")
            )

        wait_for(idle, 120, "the allocation to go idle", every=0.2)

    def prepare(self) -> None:
        """The wheelhouse built and the control plane up before anything is timed."""
        code = (
            "import sys, pathlib\n"
            "from gpulayer.cloud.wheelhouse import build_wheelhouse\n"
            "build_wheelhouse()\n"
        )
        # Where the prepare step takes it: the user cache every GPULAYER_HOME shares.
        subprocess.run([sys.executable, "-c", code], env=self.env, cwd=self.folder, check=True)
        listed = self.run("offers", "--provider", "slurm", "--json")
        if listed.returncode != 0 or not json.loads(listed.stdout):
            raise SystemExit(f"gpulayer sees no slurm offer: {listed.stderr.strip()[-500:]}")

    def first_line_seconds(self, *, local: bool = False) -> float:
        started = time.monotonic()
        process = subprocess.Popen(
            self.argv(*self.submit_args(local=local)),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=self.env,
            cwd=self.folder,
        )
        assert process.stdout is not None
        elapsed = None
        for line in process.stdout:
            if "first line" in line and elapsed is None:
                elapsed = time.monotonic() - started
        process.wait(timeout=300)
        if elapsed is None:
            raise SystemExit(f"a gpulayer job printed nothing (exit {process.returncode})")
        return elapsed

    def burst(self, jobs: int, label: str) -> tuple[float, float, int]:
        """``jobs`` submits one after another: (submissions/s, jobs/s to the last job's end,
        how many succeeded)."""
        started_wall, started = time.time(), time.monotonic()
        for _ in range(jobs):
            sent = self.run(*self.submit_args("--detach", "--label", f"bench={label}"))
            if sent.returncode != 0:
                raise SystemExit(f"gpulayer submit failed: {sent.stderr.strip()[-500:]}")
        submitted = time.monotonic() - started

        def listed() -> list[dict[str, Any]]:
            out = self.run("ls", "--label", f"bench={label}", "-n", str(jobs), "--json").stdout
            return list(json.loads(out))

        def all_ended() -> list[dict[str, Any]] | None:
            rows = listed()
            return rows if len(rows) == jobs and all(r["state"] in ENDED for r in rows) else None

        rows = wait_for(all_ended, 60 * 60, "the gpulayer jobs to end", every=2.0)
        last = max(_finished_at(self, row) for row in rows)
        succeeded = sum(1 for r in rows if r["state"] == "succeeded")
        return jobs / submitted, jobs / (last - started_wall), succeeded

    def stop(self) -> None:
        stop_local_control_plane(self.home)


def _finished_at(gpulayer: Gpulayer, row: dict[str, Any]) -> float:
    stamp = row.get("finished_at")
    if not stamp:
        shown = gpulayer.run("status", str(row["id"]), "--json").stdout
        stamp = json.loads(shown)["finished_at"]
    if isinstance(stamp, (int, float)):
        return float(stamp)
    return dt.datetime.fromisoformat(str(stamp)).timestamp()


class PlainSbatch:
    """The same command through ``sbatch --wrap`` on this machine, as the cluster's user would
    submit it, its output to a file per job in a folder the nodes share."""

    def __init__(self, cluster: SlurmCluster, folder: Path) -> None:
        self.cluster = cluster
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def submit(self, name: str) -> Path:
        output = self.folder / f"{name}.out"
        on_nodes = self.cluster.on_nodes(self.folder)
        self.cluster.command(
            "sbatch", "--parsable", f"--partition={PARTITION}", "--nodes=1", "--exclusive",
            f"--job-name={name}", f"--chdir={on_nodes}", f"--output={on_nodes / output.name}",
            f"--wrap={shlex.join(COMMAND)}",
        )  # fmt: skip
        return output

    def first_line_seconds(self, name: str) -> float:
        started = time.monotonic()
        output = self.submit(name)
        wait_for(lambda: _said_first_line(output), 300, "the sbatch job's output", every=0.01)
        return time.monotonic() - started

    def burst(self, jobs: int, label: str) -> tuple[float, float, int]:
        started_wall, started = time.time(), time.monotonic()
        outputs = [self.submit(f"{label}-{index}") for index in range(jobs)]
        submitted = time.monotonic() - started
        wait_for(
            lambda: not any(label in line for line in self.cluster.queue()),
            60 * 60,
            "the sbatch jobs to end",
            every=0.5,
        )
        done = [o for o in outputs if _said_first_line(o)]
        last = max((o.stat().st_mtime for o in done), default=time.time())
        return jobs / submitted, jobs / (last - started_wall), len(done)


def _said_first_line(path: Path) -> bool:
    try:
        return "first line" in path.read_text()
    except OSError:
        return False


def wait_idle(cluster: SlurmCluster) -> None:
    # Each round starts on an idle cluster: gpulayer's teardown (scancel) included.
    wait_for(lambda: cluster.queue() == [], 300, "an empty queue", every=0.2)
    cluster.wait_nodes_idle([n.name for n in cluster.nodes], timeout=120)


def ratio(gpulayer: float, plain: float) -> str:
    return f"{gpulayer / plain:.1f}x" if plain > 0 else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10, help="short jobs through each")
    parser.add_argument("--repeat", type=int, default=3, help="first-output rounds")
    parser.add_argument("--nodes", type=int, default=2, help="compute nodes of the cluster")
    args = parser.parse_args()
    if args.jobs < 1 or args.repeat < 1 or args.nodes < 1:
        parser.error("--jobs, --repeat and --nodes: at least 1")
    why = usable()
    if why is not None:
        print(f"skipped: {why}")
        return 0
    with tempfile.TemporaryDirectory(prefix="gpulayer-bench-slurm-") as tmp:
        base = Path(tmp)
        with cluster_of(base, args.nodes) as cluster:
            gpulayer = Gpulayer(base / "gpulayer" / "home", cluster, idle_seconds=600)
            # The burst's own home keeps no allocation warm: jobs queued in Slurm for
            # allocations of their own do not move to one that goes idle meanwhile, so warm
            # allocations holding the partition would keep them waiting for idle_seconds.
            bursting = Gpulayer(base / "burst" / "home", cluster, idle_seconds=0)
            plain = PlainSbatch(cluster, cluster.shared / "plain")
            try:
                gpulayer.prepare()
                firsts = measure_first_lines(gpulayer, plain, cluster, args.repeat)
                wait_idle(cluster)  # the warm allocation ended before its controller stops
                gpulayer.stop()
                plain_burst = plain.burst(args.jobs, "plain-burst")
                wait_idle(cluster)
                bursting.prepare()
                our_burst = bursting.burst(args.jobs, "burst")
                wait_idle(cluster)
            finally:
                gpulayer.stop()
                bursting.stop()
    print_rows(args, firsts, our_burst, plain_burst)
    return 0


def measure_first_lines(
    gpulayer: Gpulayer, plain: PlainSbatch, cluster: SlurmCluster, repeat: int
) -> dict[str, list[float]]:
    """Submit to first output, each way, ``repeat`` rounds. Rounds alternate the ways, so load
    from elsewhere falls on all alike."""
    found: dict[str, list[float]] = {"sbatch": [], "cold": [], "warm": [], "local": []}
    for round_ in range(repeat):
        gpulayer.end_warm_allocations()
        wait_idle(cluster)
        found["sbatch"].append(plain.first_line_seconds(f"plain-first-{round_}"))
        wait_idle(cluster)
        found["cold"].append(gpulayer.first_line_seconds())
        gpulayer.wait_warm()
        found["warm"].append(gpulayer.first_line_seconds())
        found["local"].append(gpulayer.first_line_seconds(local=True))
    gpulayer.end_warm_allocations()
    return found


def print_rows(
    args: argparse.Namespace,
    firsts: dict[str, list[float]],
    our_burst: tuple[float, float, int],
    plain_burst: tuple[float, float, int],
) -> None:
    median = {way: statistics.median(values) for way, values in firsts.items()}
    print(
        f"\nSlurm 22.05, {args.nodes} nodes of 2 cores in partition {PARTITION}; "
        f"command: {shlex.join(COMMAND)}"
    )
    rows = [
        ("", "sbatch --wrap", "gpulayer cold", "gpulayer warm", "gpulayer local"),
        (
            f"submit to first output, s (median of {args.repeat})",
            *(f"{median[w]:.2f}" for w in ("sbatch", "cold", "warm", "local")),
        ),
        (
            "  over sbatch --wrap",
            "1.0x",
            ratio(median["cold"], median["sbatch"]),
            ratio(median["warm"], median["sbatch"]),
            ratio(median["local"], median["sbatch"]),
        ),
        (
            "  warm over local, s",
            "",
            "",
            f"{median['warm'] - median['local']:+.2f}",
            "",
        ),
        (
            f"{args.jobs} jobs: submissions/s",
            f"{plain_burst[0]:.2f}",
            f"{our_burst[0]:.2f}",
            "",
            "",
        ),
        (
            f"{args.jobs} jobs: jobs/s to the last end",
            f"{plain_burst[1]:.3f}",
            f"{our_burst[1]:.3f}",
            "",
            "",
        ),
        (f"{args.jobs} jobs: succeeded", str(plain_burst[2]), str(our_burst[2]), "", ""),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        print("  ".join(cells).rstrip())
    print(
        f"{args.jobs} jobs through gpulayer: {ratio(plain_burst[1], our_burst[1])} the time "
        "of sbatch --wrap to the last end (an allocation per job, none kept warm)"
    )
    for way, values in firsts.items():
        print(f"first output, each round, {way}: {_rounded(values)}")


def _rounded(values: list[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


if __name__ == "__main__":
    sys.exit(main())
