"""Cloud lifecycle speed and cost to the controller, side by side in one run (no assertions;
read the ratios).

    python bench/lifecycle.py [--repeat 2] [--baseline /path/to/other/checkout]

Rows, each through the real command line and an embedded control plane:
- submit to the job's first output line on an ssh-provider host, cold (the host holds no
  wheelhouse) and warm (a second job on the same host), and on moto (an EC2 instance that
  boots as a namespace sshd host); on each, a job that takes an idle machine (`idle_seconds`
  set: the machine and its worker outlived the job before, no launch and no bootstrap); and a
  local job beside them;
- the same for a project: `submit -f job.yaml` from a 20 MB folder whose job has a
  `setup.pip` of one small package (from a package index on the hosts' network), cold (a fresh
  host: nothing installed) and warm (the same host, the same setup: the environment reused);
- the controller's CPU seconds per provisioned job (its process's user+system time from
  submit until the instance is torn down);
- a controller killed with -9 while a job runs: time from the restart to the tunnel being
  reopened, and to the job's worker heartbeating again;
- one lifecycle pass's CPU over 1,000 live instances (gathering their facts, and the pure
  decision) and one recorded transition's (bench/lifecycle_decisions.py, which runs alone too,
  with no machine);
- with ``--baseline``, the plain job's cold and warm rows once more through that checkout
  (its controller, CLI and wheelhouse), round for round beside this one's, and the ratio.

Plain jobs are submitted from an empty folder, so what travels with them is the same for every
version. Versions that ran a job in its submit folder's path on the host (before the folder
travelled) find that empty path there too.

Hosts are machines of their own (tests/support/sshd_hosts: a Debian root filesystem in their
own namespaces; needs root, iproute2 and mmdebstrap), but they share this machine's CPUs with
the controller. The controller's wheelhouse is built before timing starts, as a
controller keeps it cached between jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml

from bench.lifecycle_decisions import report as decisions_report
from tests.support.cli import run_cli
from tests.support.moto_lab import CloudInit, ec2_client, lab_vpc, moto_server, write_image_catalog
from tests.support.package_index import PackageIndex, make_wheel
from tests.support.sshd_hosts import SshdHost, SshdLab

ROOT = Path(__file__).resolve().parent.parent
FIRST_LINE = "print('first line', flush=True)"
UBUNTU = {"owners": ["099720109477"], "name": "ubuntu/images/hvm-ssd/ubuntu-*-amd64-server-*"}


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    # Polls faster than the tests' wait_until: the waits here are what is measured.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Controller:
    """The embedded control plane of one gpulayer home, driven by the CLI of ``tree`` (a
    checkout; this one by default), from an empty folder of its own."""

    def __init__(self, home: Path, extra_env: dict[str, str], tree: Path = ROOT) -> None:
        self.home = home
        self.folder = home.parent / f"{home.name}-submit"
        self.folder.mkdir(exist_ok=True)
        self.env = {
            **os.environ,
            **extra_env,
            # The checkout's own provider plugins come before any installed ones.
            "PYTHONPATH": os.pathsep.join(
                [str(tree), *(str(plugin) for plugin in sorted((tree / "providers").iterdir()))]
            ),
            "GPULAYER_HOME": str(home),
            "GPULAYER_IDLE_SECONDS": "600",
            "HTTPS_PROXY": "http://127.0.0.1:9",
            "HTTP_PROXY": "http://127.0.0.1:9",
            "NO_PROXY": "127.0.0.1,localhost",
        }

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return run_cli(list(args), env=self.env, timeout=timeout, cwd=self.folder)

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "--json").stdout)

    @property
    def pid(self) -> int:
        return int(json.loads((self.home / "server.json").read_text())["pid"])

    def first_line_seconds(self, *submit: str, cwd: Path | None = None) -> tuple[float, str]:
        """Seconds from submit to the job's first output line; the job's id. Without ``-f``,
        the job is a one-line command."""
        started = time.monotonic()
        command = [] if "-f" in submit else ["--", "python", "-c", FIRST_LINE]
        process = subprocess.Popen(
            [sys.executable, "-m", "gpulayer", "submit", *submit, *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=self.env,
            cwd=cwd or self.folder,
        )
        assert process.stdout is not None
        for line in process.stdout:
            if "first line" in line:
                break
        elapsed = time.monotonic() - started
        process.wait(timeout=300)
        job_id = self.json("ls", "-n", "1")[0]["id"]
        return elapsed, job_id

    def wait_torn_down(self, job_id: str) -> None:
        gone = {"terminated", "never_launched"}
        wait_for(
            lambda: {i["state"] for i in self.json("cost", "--job", job_id)["instances"]} <= gone,
            300,
            "teardown",
        )

    def stop(self) -> None:
        """SIGTERM, then wait for it to go: a next round's controller on this home is a new
        process, not this one on its way out."""
        try:
            pid = self.pid
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError):
            return

        def gone() -> bool:
            stat = Path(f"/proc/{pid}/stat")
            try:
                return "Z" in stat.read_text().rsplit(")", 1)[1][:3]
            except OSError:
                return True

        wait_for(gone, 60, "the controller to stop")

    def prebuild_wheelhouse(self) -> None:
        """As a controller keeps it cached between jobs: built before timing starts."""
        code = (
            "import sys, pathlib\n"
            "from gpulayer.cloud.wheelhouse import build_wheelhouse\n"
            "build_wheelhouse()\n"
        )
        # Where the prepare step takes it: the user cache every GPULAYER_HOME shares.
        command = [sys.executable, "-c", code]
        subprocess.run(command, env=self.env, cwd=self.folder, check=True)


def ssh_entry(host: SshdHost, name: str, install_root: Path) -> dict[str, Any]:
    install_root.mkdir(parents=True, exist_ok=True)
    return {
        "name": name,
        "address": host.address,
        "port": host.port,
        "user": host.user,
        "key_path": str(host.client_key),
        "authorized_keys": str(host.authorized_keys),
        "hourly_price": 0.5,
        "region": "lab",
        "python": "python3",  # the host's own
        "install_root": str(install_root),
    }


def providers_yaml(home: Path, config: dict[str, Any], record: Path) -> None:
    config = {
        **config,
        "gpulayer": {
            "deadman_seconds": 600,
            "deadman_action": f"record:{record}",
            **config.get("gpulayer", {}),
        },
    }
    (home / "providers.yaml").write_text(yaml.safe_dump(config))


def one_ssh_host(home: Path, base: Path, host: SshdHost, name: str) -> None:
    """providers.yaml offering just ``host``, installing under base/NAME."""
    root = base / name
    providers_yaml(
        home,
        {
            "ssh": {
                "hosts": [ssh_entry(host, "box", root)],
                "state_dir": str(base / f"{name}-state"),
            },
            "gpulayer": {"ssh_cidr": "127.0.0.1/32"},
        },
        base / "deadman.jsonl",
    )


def keep_warm(home: Path, provider: str, seconds: float) -> None:
    """Set the provider's own idle_seconds in providers.yaml."""
    path = home / "providers.yaml"
    config = yaml.safe_load(path.read_text())
    config[provider]["idle_seconds"] = seconds
    path.write_text(yaml.safe_dump(config))


def on_idle_machine(controller: Controller, provider: str, *submit: str) -> float:
    """With idle_seconds set: a job that leaves its machine idle, then the measured one, which
    takes it; the machine is reaped after. Seconds from submit to first line."""
    keep_warm(controller.home, provider, 120)
    _, first = controller.first_line_seconds(*submit)

    def idle() -> bool:
        return any(i["state"] == "idle" for i in controller.json("instances"))

    wait_for(idle, 120, "the machine to go idle")
    seconds, job_id = controller.first_line_seconds(*submit)
    taken = controller.json("cost", "--job", job_id)["instances"]
    shares = controller.json("cost", "--job", first)["instances"]
    assert len(taken) == 1 and [i["state"] for i in shares] == ["handed_over"], (taken, shares)
    wait_for(lambda: controller.json("status", job_id)["state"] == "succeeded", 120, "the job")
    wait_for(idle, 120, "the machine to go idle again")
    controller.run("reap")
    controller.wait_torn_down(job_id)
    keep_warm(controller.home, provider, 0)
    return seconds


def project(base: Path, index: PackageIndex) -> Path:
    """A 20 MB folder (code and data files) whose job needs one small package."""
    folder = base / "project"
    if folder.exists():
        return folder
    (folder / "data").mkdir(parents=True)
    for n in range(20):
        (folder / "data" / f"shard-{n:02d}.bin").write_bytes(os.urandom(1024 * 1024))
    (folder / "train.py").write_text(
        "import gltest_greeting\nprint('first line', gltest_greeting.WORDS, flush=True)\n"
    )
    spec = {
        "workload": {"kind": "command", "command": ["python", "train.py"]},
        "placement": {"target": "cloud"},
        "setup": {"pip": ["gltest-greeting==1.0"], "index_url": index.url},
    }
    (folder / "job.yaml").write_text(yaml.safe_dump(spec))
    return folder


def measure_baseline(base: Path, lab: SshdLab, round_: int, tree: Path) -> dict[str, float]:
    """The plain job's cold and warm rows through another checkout's controller."""
    home = base / f"baseline-home-{round_}"
    home.mkdir()
    controller = Controller(home, {}, tree)
    controller.prebuild_wheelhouse()
    host = lab.add_host(f"lb{round_}")
    host.run(["mkdir", "-p", str(controller.folder)], check=True)
    one_ssh_host(home, base, host, f"baseline-installs-{round_}")
    try:
        controller.run("ls")
        found = {}
        for kind in ("cold", "warm"):
            found[kind], job_id = controller.first_line_seconds("--target", "cloud")
            controller.wait_torn_down(job_id)
        return found
    finally:
        controller.stop()
        lab.remove_host(host)


def measure_ssh(
    base: Path, lab: SshdLab, repeat: int, index: PackageIndex, baseline: Path | None
) -> dict[str, list[float]]:
    home = base / "ssh-home"
    home.mkdir()
    folder = project(base, index)
    rows: dict[str, list[float]] = {
        "cold": [], "warm": [], "cpu": [], "tunnel": [], "rejoin": [], "idle": [], "local": [],
        "project cold": [], "project warm": [], "baseline cold": [], "baseline warm": [],
    }  # fmt: skip
    for round_ in range(repeat):
        if baseline is not None:
            for kind, seconds in measure_baseline(base, lab, round_, baseline).items():
                rows[f"baseline {kind}"].append(seconds)
        host = lab.add_host(f"lc{round_}")
        one_ssh_host(home, base, host, f"installs-{round_}")
        controller = Controller(home, {})
        controller.prebuild_wheelhouse()
        controller.run("ls")  # the control plane is up before timing starts
        for kind in ("cold", "warm"):
            before = cpu_seconds(controller.pid)
            seconds, job_id = controller.first_line_seconds("--target", "cloud")
            controller.wait_torn_down(job_id)
            rows[kind].append(seconds)
            rows["cpu"].append(cpu_seconds(controller.pid) - before)
        rows["idle"].append(on_idle_machine(controller, "ssh", "--target", "cloud"))
        rows["local"].append(controller.first_line_seconds("--target", "local")[0])
        tunnel, rejoin = measure_restart(controller, host, f"/tmp/gate-{round_}")
        rows["tunnel"].append(tunnel)
        rows["rejoin"].append(rejoin)
        # A fresh host for the project: nothing of the first jobs' installs on it.
        fresh = lab.add_host(f"lp{round_}")
        one_ssh_host(home, base, fresh, f"project-installs-{round_}")
        for kind in ("project cold", "project warm"):
            seconds, job_id = controller.first_line_seconds("-f", "job.yaml", cwd=folder)
            controller.wait_torn_down(job_id)
            rows[kind].append(seconds)
        lab.remove_host(fresh)
        controller.stop()
        lab.remove_host(host)
    return rows


def measure_restart(controller: Controller, host: SshdHost, gate: str) -> tuple[float, float]:
    """The gate is a file on the host (which shares no disk with this machine)."""
    script = (
        "import pathlib, time\n"
        f"gate = pathlib.Path({gate!r})\n"
        "while not gate.exists(): time.sleep(0.1)\n"
    )
    job_id = controller.run(
        "submit", "-d", "--target", "cloud", "--", "python", "-c", script
    ).stdout.strip()
    wait_for(lambda: controller.json("status", job_id)["state"] == "running", 300, "the job to run")
    pid = controller.pid
    os.kill(pid, signal.SIGKILL)
    wait_for(
        lambda: (
            not Path(f"/proc/{pid}").exists()
            or "Z" in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]
        ),
        30,
        "the kill",
    )
    (controller.home / "server.json").unlink(missing_ok=True)
    restarted = time.monotonic()
    restarted_wall = time.time()
    controller.run("ls")
    wait_for(
        lambda: "SSH tunnel reopened" in controller.run("logs", job_id).stderr, 120, "the tunnel"
    )
    tunnel = time.monotonic() - restarted
    worker_name = controller.json("status", job_id)["attempts"][0]["worker_name"]

    def heartbeat_after_restart() -> bool:
        from datetime import datetime

        for worker in controller.json("workers"):
            if worker["name"] == worker_name:
                seen = datetime.fromisoformat(worker["last_heartbeat"]).timestamp()
                return seen > restarted_wall + tunnel
        return False

    wait_for(heartbeat_after_restart, 120, "the worker's heartbeat")
    rejoin = time.monotonic() - restarted
    host.run(["touch", gate], check=True)
    wait_for(lambda: controller.json("status", job_id)["state"] == "succeeded", 120, "the job")
    controller.wait_torn_down(job_id)
    return tunnel, rejoin


def measure_moto(base: Path, lab: SshdLab, repeat: int) -> dict[str, list[float]]:
    home = base / "aws-home"
    home.mkdir()
    rows: dict[str, list[float]] = {"moto": [], "cpu": [], "idle": []}
    with moto_server() as moto:
        assert lab.subnet is not None
        ec2 = ec2_client(moto.url)
        subnets = lab_vpc(ec2, lab.subnet, ("us-east-1a",))
        images = write_image_catalog(base / "images", "lab-1", {**UBUNTU, "ssh_user": "root"})
        install_root = base / "aws-installs"
        install_root.mkdir()
        env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_CONFIG_FILE": str(base / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(base / "no-aws-credentials"),
            "AWS_EC2_METADATA_DISABLED": "true",
            "GPULAYER_IMAGES_DIR": str(images),
        }
        providers_yaml(
            home,
            {
                "aws": {
                    "regions": ["us-east-1"],
                    "endpoint_url": moto.url,
                    "use_private_ip": True,
                    "subnet_ids": subnets,
                    "price_source": "catalog",
                    "cache_dir": str(base / "aws-cache"),
                    "python": "python3",  # the instance's own
                    "install_root": str(install_root),
                    "poll_seconds": 0.1,
                    "terminate_timeout_seconds": 30,
                },
                "gpulayer": {"ssh_cidr": f"{lab.gateway}/32"},
            },
            base / "deadman-aws.jsonl",
        )
        emulator = CloudInit(moto.url, lab)
        emulator.start()
        controller = Controller(home, env)
        controller.prebuild_wheelhouse()
        try:
            controller.run("offers", "--provider", "aws")  # fills the offer cache
            controller.run("ls")  # the control plane is up before timing starts
            for _ in range(repeat):
                before = cpu_seconds(controller.pid)
                seconds, job_id = controller.first_line_seconds(
                    "--target", "cloud", "--provider", "aws"
                )
                controller.wait_torn_down(job_id)
                rows["moto"].append(seconds)
                rows["cpu"].append(cpu_seconds(controller.pid) - before)
                rows["idle"].append(
                    on_idle_machine(controller, "aws", "--target", "cloud", "--provider", "aws")
                )
        finally:
            controller.stop()
            emulator.stop()
    return rows


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--baseline", type=Path, help="another checkout to run beside this one")
    parser.add_argument("--instances", type=int, default=1000, help="live instances in a pass")
    args = parser.parse_args()
    baseline = args.baseline.resolve() if args.baseline is not None else None
    with tempfile.TemporaryDirectory(prefix="gpulayer-bench-lifecycle-") as scratch:
        base = Path(scratch)
        lab = SshdLab.create(base / "lab")
        try:
            if not lab.namespaced:
                raise SystemExit("needs root and iproute2: instances are network namespaces")
            make_wheel(
                base / "wheels", "gltest-greeting", "1.0", {"gltest_greeting.py": "WORDS = 1\n"}
            )
            with PackageIndex(base / "wheels", address=lab.gateway) as index:
                ssh = measure_ssh(base, lab, args.repeat, index, baseline)
            aws = measure_moto(base, lab, args.repeat)
        finally:
            lab.close()
    cold, warm, moto = median(ssh["cold"]), median(ssh["warm"]), median(aws["moto"])
    print(f"{'submit -> first output line':<44}{'seconds':>10}{'vs ssh cold':>14}")
    for label, value in (
        ("ssh host, cold wheelhouse", cold),
        ("ssh host, warm wheelhouse", warm),
        ("moto instance", moto),
        ("ssh host, idle machine (idle_seconds)", median(ssh["idle"])),
        ("moto instance, idle machine (idle_seconds)", median(aws["idle"])),
        ("local job (no machine to rent)", median(ssh["local"])),
    ):
        print(f"  {label:<42}{value:>10.2f}{value / cold:>13.2f}x")
    project_cold, project_warm = median(ssh["project cold"]), median(ssh["project warm"])
    print(f"{'20 MB project with setup.pip -> first line':<44}{'seconds':>10}{'vs plain':>14}")
    print(
        f"  {'fresh host (nothing installed)':<42}{project_cold:>10.2f}{project_cold / cold:>13.2f}x"
    )
    print(
        f"  {'same host, same setup (reused)':<42}{project_warm:>10.2f}{project_warm / warm:>13.2f}x"
    )
    cpu_ssh, cpu_aws = median(ssh["cpu"]), median(aws["cpu"])
    print(f"{'controller CPU-seconds per provisioned job':<44}{'seconds':>10}{'vs ssh':>14}")
    print(f"  {'ssh host (submit to teardown)':<42}{cpu_ssh:>10.2f}{1.0:>13.2f}x")
    print(
        f"  {'moto instance (submit to teardown)':<42}{cpu_aws:>10.2f}{cpu_aws / cpu_ssh:>13.2f}x"
    )
    tunnel, rejoin = median(ssh["tunnel"]), median(ssh["rejoin"])
    print(f"{'controller restart (kill -9) -> resumed job':<44}{'seconds':>10}{'vs rejoin':>14}")
    print(f"  {'tunnel reopened':<42}{tunnel:>10.2f}{tunnel / rejoin:>13.2f}x")
    print(f"  {'worker heartbeating again':<42}{rejoin:>10.2f}{1.0:>13.2f}x")
    if baseline is not None:
        print(
            f"{'plain job on an ssh host, beside --baseline':<44}{'baseline':>10}{'now':>8}{'ratio':>8}"
        )
        for kind in ("cold", "warm"):
            before, now = median(ssh[f"baseline {kind}"]), median(ssh[kind])
            print(
                f"  {kind + ' (submit -> first line, s)':<42}{before:>10.2f}{now:>8.2f}{now / before:>7.2f}x"
            )
    print(f"(medians of {args.repeat} run(s); {os.cpu_count()} CPUs shared with the hosts)")
    decisions_report(args.instances, 100)


if __name__ == "__main__":
    main()
