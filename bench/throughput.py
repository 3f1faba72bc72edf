"""Jobs per second through a team server, side by side in one run.

    python bench/throughput.py [--jobs 1000] [--cli-jobs 200] [--workers 4]
                               [--baseline /path/to/other/checkout] [--databases sqlite,postgresql]

For each checkout (this one, and ``--baseline`` when given) and each database, starts a real
`gpulayer server` and ``--workers`` `gpulayer worker start` processes on loopback, then runs:

- launch_many: one SDK process submits ``--jobs`` jobs (``gl.launch_many`` where the checkout
  has it, else one ``gl.launch`` each) and the clock runs until every job has finished;
- cli: 20 concurrent shells run ``gpulayer submit -d`` ``--cli-jobs`` times in all, and
  then, as its floor, the same shells start ``python -c pass`` as many times (no Python CLI's
  burst can go faster on this machine);
- array: one ``gpulayer submit --array 0-N`` (where the checkout has it);
- function_map: ``fn.map(range(--items))`` of a trivial function through the local control
  plane a fresh GPULAYER_HOME starts (each item its own job, run in a warm interpreter of the
  local worker), twice (the first map also starts the interpreters), beside a plain
  ``multiprocessing.Pool.map`` of the same function as the floor, with the local control
  plane's CPU-ms an item (its worker runs in the same process);
- busy (only when named in ``--scenarios``): 20 threads submit ``--jobs`` jobs to a server that
  20 workers keep busy, and each submit's median, 99th percentile and slowest latency is shown;

and prints, per scenario, jobs/s end to end, HTTP requests the server answered per job, server
and worker CPU-ms per job (and the CLI's CPU-ms per submit), with every job checked to have run
exactly once. Where slurm-wlm is installed, a one-node Slurm cluster the bench starts takes the
same CLI burst through ``sbatch --wrap true`` for scale. No assertions: read the numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

ADMIN = "bench-admin-token-0123456789"
CLK = os.sysconf("SC_CLK_TCK")
TERMINAL = {"succeeded", "failed", "cancelled"}
CLI_SHELLS = 20


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """The process's own CPU plus that of its children it waited for."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / CLK


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def shell_burst(line: str, count: int, **popen: Any) -> None:
    """Run ``line`` ``count`` times in all from CLI_SHELLS shells at once; wait for them."""
    each = [count // CLI_SHELLS + (i < count % CLI_SHELLS) for i in range(CLI_SHELLS)]
    shells = [
        subprocess.Popen(["sh", "-c", f"for i in $(seq {n}); do {line}; done"], **popen)
        for n in each
        if n
    ]
    for shell in shells:
        shell.wait()


@dataclass
class Tree:
    """A gpulayer checkout whose code the processes run."""

    label: str
    path: Path

    def env(self, home: Path, **extra: str) -> dict[str, str]:
        paths = [self.path] + [self.path / "providers" / p for p in ("aws", "gcp", "ssh")]
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("GPULAYER_SERVER", "GPULAYER_TOKEN", "PYTHONPATH")
        }
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
        env["GPULAYER_HOME"] = str(home)
        env.update(extra)
        return env

    def has(self, *args: str, marker: str) -> bool:
        scratch = Path(tempfile.mkdtemp())
        probe = subprocess.run(
            [sys.executable, "-m", "gpulayer", *args],
            env=self.env(scratch),
            cwd=scratch,
            capture_output=True,
            text=True,
        )
        return marker in probe.stdout


@dataclass
class Cluster:
    tree: Tree
    base: Path
    database_url: str | None
    workers: int
    url: str = ""
    count_file: Path = field(default_factory=Path)
    server: subprocess.Popen[bytes] | None = None
    worker_procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self) -> Cluster:
        from gpulayer.protocol.client import ControlClient

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        home = self.base / "server"
        home.mkdir(parents=True)
        self.count_file = self.base / "requests"
        args = [
            sys.executable,
            str(HERE / "serve_counted.py"),
            str(self.count_file),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--heartbeat-timeout",
            "60",
        ]
        if self.database_url:
            args += ["--database-url", self.database_url]
        log = (home / "server.log").open("ab")
        self.server = subprocess.Popen(
            args,
            env=self.tree.env(home, GPULAYER_TOKEN=ADMIN),
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        client = ControlClient(self.url, ADMIN, timeout=60)
        wait(lambda: _healthy(client), 60, "server start")
        token = client.request("POST", "/v1/tokens", {"kind": "worker"})["token"]
        for i in range(self.workers):
            whome = self.base / f"w{i}"
            whome.mkdir()
            token_file = whome / "join.token"
            token_file.write_text(token + "\n")
            token_file.chmod(0o600)
            wlog = (whome / "worker.log").open("ab")
            self.worker_procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "gpulayer",
                        "worker",
                        "start",
                        "--server",
                        self.url,
                        "--token-file",
                        str(token_file),
                        "--name",
                        f"w{i}",
                    ],
                    env=self.tree.env(whome),
                    cwd=whome,  # `python -m` puts the cwd first on sys.path: not this checkout
                    stdout=wlog,
                    stderr=wlog,
                    start_new_session=True,
                )
            )
        wait(
            lambda: sum(w["state"] == "ready" for w in client.workers()) >= self.workers,
            60,
            "workers ready",
        )
        return self

    def client(self) -> Any:
        from gpulayer.protocol.client import ControlClient

        return ControlClient(self.url, ADMIN, timeout=120)

    def requests(self) -> int:
        time.sleep(0.15)  # the counter is written every 0.1 s
        return int(self.count_file.read_text() or 0)

    def server_cpu(self) -> float:
        assert self.server is not None
        return cpu_seconds(self.server.pid)

    def worker_cpu(self) -> float:
        return sum(cpu_seconds(p.pid) for p in self.worker_procs)

    def stop(self) -> None:
        for proc in [*self.worker_procs, self.server]:
            if proc is None or proc.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in [*self.worker_procs, self.server]:
            if proc is None:
                continue
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def _healthy(client: Any) -> bool:
    try:
        client.health(timeout=1)
        return True
    except Exception:
        return False


def wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


@dataclass
class Result:
    jobs: int
    seconds: float
    requests: int
    server_cpu: float
    worker_cpu: float
    client_cpu: float | None = None
    exactly_once: bool = True

    def row(self) -> dict[str, str]:
        n = max(self.jobs, 1)
        return {
            "jobs/s": f"{self.jobs / self.seconds:.1f}",
            "requests/job": f"{self.requests / n:.1f}",
            "server CPU-ms/job": f"{self.server_cpu * 1000 / n:.1f}",
            "worker CPU-ms/job": f"{self.worker_cpu * 1000 / n:.1f}",
            "client CPU-ms/job": "-"
            if self.client_cpu is None
            else f"{self.client_cpu * 1000 / n:.0f}",
            "all exactly once": "yes" if self.exactly_once else "NO",
        }


def until_finished(cluster: Cluster, expected: int, timeout: float = 1800) -> tuple[int, bool]:
    """Wait until `expected` jobs exist and none is live; (polling requests, exactly once)."""
    client = cluster.client()
    polls = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        polls += 1
        if not client.jobs(limit=1, states=["queued", "provisioning", "running"]):
            polls += 1
            jobs = client.jobs(limit=expected + 10)
            if len(jobs) >= expected:
                good = len(jobs) == expected and all(
                    j["state"] == "succeeded" and j["attempts"] == 1 for j in jobs
                )
                if not good:
                    states = Counter((j["state"], j.get("reason"), j["attempts"]) for j in jobs)
                    print(f"  not all exactly once: {dict(states)}", file=sys.stderr)
                return polls, good
        time.sleep(0.05)
    raise RuntimeError("jobs did not finish")


_SDK_SUBMITTER = """
import json, sys, time
import gpulayer as gl
n = int(sys.argv[1])
spec = {"workload": {"kind": "command", "command": ["true"]},
        "placement": {"target": "remote"}, "resources": {"cpu_cores": 0.1}}
many = getattr(gl, "launch_many", None)
if many is not None:
    jobs = many([spec] * n)
else:
    jobs = [gl.launch(spec) for _ in range(n)]
print(json.dumps(len(jobs)))
"""


def measure(cluster: Cluster, run: Any, jobs: int) -> Result:
    client_before = children_cpu()
    requests = cluster.requests()
    server, worker = cluster.server_cpu(), cluster.worker_cpu()
    started = time.monotonic()
    run()
    polls, good = until_finished(cluster, jobs)
    seconds = time.monotonic() - started
    return Result(
        jobs=jobs,
        seconds=seconds,
        requests=cluster.requests() - requests - polls,
        server_cpu=cluster.server_cpu() - server,
        worker_cpu=cluster.worker_cpu() - worker,
        client_cpu=children_cpu() - client_before,
        exactly_once=good,
    )


def scenario(
    tree: Tree, database: str, name: str, jobs: int, workers: int, base: Path
) -> Result | None:
    source = base / "src"
    source.mkdir(parents=True)
    (source / "train.py").write_text("print('hello')\n")
    with database_url(database) as url:
        cluster = Cluster(tree, base / "cluster", url, workers).start()
        try:
            env = tree.env(base / "client", GPULAYER_SERVER=cluster.url, GPULAYER_TOKEN=ADMIN)

            if name == "launch_many":

                def run() -> None:
                    subprocess.run(
                        [sys.executable, "-c", _SDK_SUBMITTER, str(jobs)],
                        env=env,
                        cwd=source,
                        check=True,
                        stdout=subprocess.DEVNULL,
                    )

            elif name == "cli":
                line = f"{sys.executable} -m gpulayer submit -d --target remote -- true >/dev/null"

                def run() -> None:
                    shell_burst(line, jobs, env=env, cwd=source)

            else:

                def run() -> None:
                    subprocess.run(
                        [
                            sys.executable,
                            "-m",
                            "gpulayer",
                            "submit",
                            "-d",
                            "--target",
                            "remote",
                            "--array",
                            f"0-{jobs - 1}",
                            "--",
                            "true",
                        ],
                        env=env,
                        cwd=source,
                        check=True,
                        stdout=subprocess.DEVNULL,
                    )

            return measure(cluster, run, jobs)
        finally:
            cluster.stop()


@contextlib.contextmanager
def database_url(database: str) -> Iterator[str | None]:
    if database == "sqlite":
        yield None
        return
    from tests.support.servers import postgres_cluster

    with postgres_cluster() as url:
        yield url


def interpreter_floor(starts: int) -> tuple[float, float]:
    """(starts/s, CPU-ms a start) for the CLI burst's 20 shells starting this Python with
    nothing to do, ``starts`` times in all: what any Python CLI's burst is bounded by here."""
    before = children_cpu()
    started = time.monotonic()
    shell_burst(f"{sys.executable} -c pass", starts)
    seconds = time.monotonic() - started
    return starts / seconds, (children_cpu() - before) * 1000 / starts


# --- a busy server's slowest submit --------------------------------------------------------


BUSY_WORKERS = 20
BUSY_THREADS = 20


def busy_submit_latency(tree: Tree, database: str, base: Path, jobs: int) -> dict[str, str]:
    """Each submit's latency while 20 threads submit ``jobs`` jobs of ``sh -c true`` (a quarter
    core each) to a server that 20 workers keep busy: its median, 99th percentile and slowest,
    and the submits that failed. A submit waiting behind the others shows as the slowest."""
    import threading

    with database_url(database) as url:
        cluster = Cluster(tree, base / "cluster", url, BUSY_WORKERS).start()
        try:
            spec = {
                "workload": {"kind": "command", "command": ["sh", "-c", "true"]},
                "resources": {"cpu_cores": 0.25},
                "placement": {"target": "remote"},
            }
            took: list[float] = []
            failed: list[str] = []
            lock = threading.Lock()

            def submitter(count: int) -> None:
                client = cluster.client()
                for _ in range(count):
                    started = time.perf_counter()
                    try:
                        client.submit(spec)
                    except Exception as exc:
                        with lock:
                            failed.append(type(exc).__name__)
                        continue
                    with lock:
                        took.append(time.perf_counter() - started)

            each = [jobs // BUSY_THREADS + (i < jobs % BUSY_THREADS) for i in range(BUSY_THREADS)]
            threads = [threading.Thread(target=submitter, args=(n,)) for n in each if n]
            started = time.monotonic()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            seconds = time.monotonic() - started
        finally:
            cluster.stop()
    took.sort()
    return {
        "submits/s": f"{len(took) / seconds:.1f}",
        "median s": f"{took[len(took) // 2]:.2f}" if took else "-",
        "99th percentile s": f"{took[int(len(took) * 0.99)]:.2f}" if took else "-",
        "slowest s": f"{took[-1]:.2f}" if took else "-",
        "failed submits": str(len(failed)),
    }


# --- fn.map through the local control plane -------------------------------------------------


_MAP_MODULE = "def square(x):\n    return x * x\n"

_MAPPER = """
import json, os, sys, time
from pathlib import Path
import gpulayer as gl
from bench_map_items import square

items = int(sys.argv[1])
home = Path(os.environ["GPULAYER_HOME"])
remote = gl.remote(square)
rows = {}
for run in (1, 2):
    started = time.perf_counter()
    if run == 2:
        pid = json.loads((home / "server.json").read_text())["pid"]
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    out = remote.map(range(items), timeout=1200)
    rows[run] = items / (time.perf_counter() - started)
    assert out == [i * i for i in range(items)], "a result is wrong"
if json.loads((home / "server.json").read_text())["pid"] != pid:
    cpu = float("nan")  # restarted in between (its code changed): no figure
else:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK") - cpu
from gpulayer.sdk.connection import connect

jobs = connect(None).client.jobs(limit=2 * items + 10)
once = len(jobs) == 2 * items and all(
    j["state"] == "succeeded" and j["attempts"] == 1 for j in jobs
)
print(json.dumps({"first": rows[1], "second": rows[2], "cpu_ms": cpu * 1000 / items,
                  "once": once}))
"""


def print_function_map(trees: list[Tree], base: Path, items: int) -> None:
    print_table(
        f"function_map: fn.map(range({items})) of a trivial function, locally",
        {tree.label: function_map_row(tree, base / f"map-{tree.label}", items) for tree in trees},
    )
    print(
        f"  floor: multiprocessing.Pool.map of the same function: "
        f"{pool_map_rate(items):,.0f} items/s"
    )


def function_map_row(tree: Tree, base: Path, items: int) -> dict[str, str]:
    """fn.map of a trivial function run twice by an SDK process of ``tree``'s code, through
    the local control plane it starts in a fresh GPULAYER_HOME."""
    import json

    from tests.support.daemon import stop_local_control_plane

    source = base / "src"
    source.mkdir(parents=True)
    (source / "bench_map_items.py").write_text(_MAP_MODULE)
    home = base / "home"
    env = tree.env(home)
    env["PYTHONPATH"] = os.pathsep.join([str(source), env["PYTHONPATH"]])
    try:
        done = subprocess.run(
            [sys.executable, "-c", _MAPPER, str(items)],
            env=env,
            cwd=source,
            capture_output=True,
            text=True,
            timeout=3600,
        )
    finally:
        stop_local_control_plane(home)
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
        return {k: "failed" for k in _MAP_COLUMNS}
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "items/s, first map": f"{found['first']:.1f}",
        "items/s, second map": f"{found['second']:.1f}",
        "control plane CPU-ms/item": f"{found['cpu_ms']:.2f}",
        "all exactly once": "yes" if found["once"] else "NO",
    }


_MAP_COLUMNS = (
    "items/s, first map",
    "items/s, second map",
    "control plane CPU-ms/item",
    "all exactly once",
)


_POOL_MAPPER = """
import json, multiprocessing, sys, time

def square(x):
    return x * x

items = int(sys.argv[1])
started = time.perf_counter()
with multiprocessing.Pool() as pool:
    out = pool.map(square, range(items))
rate = items / (time.perf_counter() - started)
assert out == [i * i for i in range(items)]
print(json.dumps(rate))
"""


def pool_map_rate(items: int) -> float:
    """Items/s of a plain multiprocessing.Pool.map of the same function (in a process of its
    own: this folder on sys.path would shadow the standard library's ``queue``)."""
    import json

    done = subprocess.run(
        [sys.executable, "-c", _POOL_MAPPER, str(items)],
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(done.stdout))


# --- wrong tokens ---------------------------------------------------------------------------


def bad_token_latency(tree: Tree, base: Path, calls: int = 200) -> dict[str, str]:
    """Median latency of an admin call alone, then while 8 clients send wrong tokens."""
    import statistics
    import threading

    from gpulayer.protocol.client import ControlClient

    cluster = Cluster(tree, base, None, 0).start()
    try:
        good = cluster.client()

        def timed() -> float:
            samples = []
            for _ in range(calls):
                started = time.perf_counter()
                good.jobs(limit=1)
                samples.append(time.perf_counter() - started)
            return statistics.median(samples) * 1000

        alone = timed()
        stop = threading.Event()
        sent = [0]

        def attacker(i: int) -> None:
            client = ControlClient(cluster.url, f"wrong-password-{i}", timeout=60)
            n = 0
            while not stop.is_set():
                n += 1
                with contextlib.suppress(Exception):
                    client.request("GET", "/v1/jobs", params={"limit": 1})
                client.use_token(f"wrong-password-{i}-{n}")  # a new guess each time
                sent[0] += 1

        threads = [threading.Thread(target=attacker, args=(i,), daemon=True) for i in range(8)]
        for thread in threads:
            thread.start()
        busy = timed()
        stop.set()
        for thread in threads:
            thread.join(60)
        return {
            "median ms alone": f"{alone:.1f}",
            "median ms, 8 bad-token clients": f"{busy:.1f}",
            "bad calls answered": str(sent[0]),
        }
    finally:
        cluster.stop()


# --- Slurm ----------------------------------------------------------------------------------


@contextlib.contextmanager
def slurm_cluster(base: Path) -> Iterator[dict[str, str]]:
    """slurmctld and one slurmd on this host, with their own munge key and socket."""
    import pwd

    base.mkdir(parents=True)
    base.chmod(0o755)
    munge = pwd.getpwnam("munge")
    key = base / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chown(key, munge.pw_uid, munge.pw_gid)
    key.chmod(0o400)
    sock_dir = base / "munge"
    sock_dir.mkdir()
    os.chown(sock_dir, munge.pw_uid, munge.pw_gid)
    socket_path = sock_dir / "munge.socket"
    procs: list[subprocess.Popen[bytes]] = []
    subprocess.run(
        [
            "runuser",
            "-u",
            "munge",
            "--",
            "munged",
            f"--key-file={key}",
            f"--socket={socket_path}",
            f"--pid-file={sock_dir / 'munged.pid'}",
            f"--log-file={sock_dir / 'munged.log'}",
            f"--seed-file={sock_dir / 'seed'}",
        ],
        check=True,
    )
    host = socket.gethostname().split(".")[0]
    cpus = os.cpu_count() or 1
    conf = base / "slurm.conf"
    port = free_port()
    conf.write_text(
        f"""ClusterName=bench
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={port}
SlurmdPort={free_port()}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={socket_path}
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool-%n
SlurmctldPidFile={base}/slurmctld.pid
SlurmdPidFile={base}/slurmd-%n.pid
SlurmctldLogFile={base}/slurmctld.log
SlurmdLogFile={base}/slurmd-%n.log
MpiDefault=none
SchedulerType=sched/backfill
MaxJobCount=100000
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=n1 NodeHostname={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000
PartitionName=bench Nodes=n1 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:50
"""
    )
    (base / "state").mkdir()
    env = {**os.environ, "SLURM_CONF": str(conf)}
    try:
        quiet: dict[str, Any] = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        procs.append(subprocess.Popen(["slurmctld", "-D", "-f", str(conf)], env=env, **quiet))
        procs.append(
            subprocess.Popen(["slurmd", "-D", "-f", str(conf), "-N", "n1"], env=env, **quiet)
        )

        def idle() -> bool:
            out = subprocess.run(
                ["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True
            ).stdout
            return "idle" in out

        wait(idle, 60, "slurm node idle")
        yield env
    finally:
        for proc in procs:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=15)
        pid_file = sock_dir / "munged.pid"
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGTERM)


def slurm_burst(jobs: int, base: Path) -> tuple[float, float] | str:
    """(submissions/s, jobs/s end to end) for 20 concurrent shells of `sbatch --wrap true`."""
    if shutil.which("sbatch") is None or shutil.which("slurmctld") is None:
        return "skipped: slurm-wlm is not installed (apt-get install slurm-wlm)"
    try:
        with slurm_cluster(base) as env:
            line = f"sbatch -Q -o /dev/null --wrap true --chdir {base} >/dev/null"
            started = time.monotonic()
            shell_burst(line, jobs, env=env)
            submitted = time.monotonic() - started

            def drained() -> bool:
                out = subprocess.run(
                    ["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True
                ).stdout
                return not out.strip()

            wait(drained, 1800, "slurm queue drained")
            return jobs / submitted, jobs / (time.monotonic() - started)
    except (OSError, subprocess.CalledProcessError, RuntimeError, KeyError) as exc:
        return f"skipped: the Slurm cluster did not start ({exc})"


# --- report ---------------------------------------------------------------------------------


def print_table(title: str, columns: dict[str, dict[str, str]]) -> None:
    if not columns:
        return
    metrics = list(next(iter(columns.values())).keys())
    width = max(len(m) for m in metrics) + 2
    col = max(14, *(len(c) + 2 for c in columns))
    print(f"\n{title}")
    print(" " * width + "".join(f"{c:>{col}}" for c in columns))
    for metric in metrics:
        print(f"{metric:<{width}}" + "".join(f"{v[metric]:>{col}}" for v in columns.values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs for launch_many and array")
    parser.add_argument("--cli-jobs", type=int, default=200, help="submits in the CLI burst")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--baseline", type=Path, help="another checkout to run beside this one")
    parser.add_argument("--databases", default="sqlite,postgresql")
    parser.add_argument("--scenarios", default="launch_many,cli,array,function_map,badtokens")
    parser.add_argument("--items", type=int, default=1000, help="items of the function map")
    parser.add_argument("--no-slurm", action="store_true")
    args = parser.parse_args()
    trees = [Tree("this", ROOT)]
    if args.baseline is not None:
        trees.insert(0, Tree("baseline", args.baseline.resolve()))
    base = Path(tempfile.mkdtemp(prefix="gpulayer-bench-throughput-"))
    base.chmod(0o755)
    scenarios = [s for s in args.scenarios.split(",") if s]
    print(
        f"{args.jobs} jobs (launch_many, array), {args.cli_jobs} CLI submits from "
        f"{CLI_SHELLS} shells, {args.workers} workers, `true` per job; {os.cpu_count()} cores"
    )
    notes: list[str] = []
    try:
        if "function_map" in scenarios:
            print_function_map(trees, base, args.items)
        for name in [s for s in scenarios if s not in ("badtokens", "busy", "function_map")]:
            columns: dict[str, dict[str, str]] = {}
            for database in [d for d in args.databases.split(",") if d]:
                for tree in trees:
                    if name == "array" and not tree.has("submit", "--help", marker="--array"):
                        notes.append(f"{tree.label}: no `submit --array`")
                        continue
                    jobs = args.cli_jobs if name == "cli" else args.jobs
                    where = base / f"{name}-{database}-{tree.label}"
                    result = scenario(tree, database, name, jobs, args.workers, where)
                    if result is not None:
                        columns[f"{tree.label}/{database}"] = result.row()
            print_table(name, columns)
            if name == "cli":
                rate, cpu_ms = interpreter_floor(args.cli_jobs)
                print(
                    f"  floor: the same {CLI_SHELLS} shells starting `python -c pass` instead: "
                    f"{rate:.1f}/s, {cpu_ms:.0f} CPU-ms a start"
                )
        if "busy" in scenarios:
            print_table(
                f"each submit's latency: {BUSY_THREADS} threads submit {args.jobs} jobs, "
                f"{BUSY_WORKERS} workers",
                {
                    f"{tree.label}/{database}": busy_submit_latency(
                        tree, database, base / f"busy-{database}-{tree.label}", args.jobs
                    )
                    for database in [d for d in args.databases.split(",") if d]
                    for tree in trees
                },
            )
        if "badtokens" in scenarios:
            print_table(
                "an admin call's latency while 8 clients send wrong tokens (sqlite)",
                {
                    f"{tree.label}/sqlite": bad_token_latency(tree, base / f"bad-{tree.label}")
                    for tree in trees
                },
            )
        if not args.no_slurm:
            slurm = slurm_burst(args.cli_jobs, base / "slurm")
            print("\nslurm (sbatch --wrap true from 20 shells)")
            if isinstance(slurm, str):
                print(f"  {slurm}")
            else:
                print(f"  submissions/s {slurm[0]:.1f}   jobs/s end to end {slurm[1]:.1f}")
        for note in notes:
            print(f"note: {note}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
