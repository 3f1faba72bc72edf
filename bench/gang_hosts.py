"""bench/gang.py --hosts: a 2-node gang on two warm honest hosts beside plain torchrun on the
same hosts, in turns within one run (see bench/gang.py's docstring)."""

from __future__ import annotations

import base64
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml

from bench.lifecycle import Controller, ssh_entry, wait_for
from tests.support.cli import run_cli
from tests.support.package_index import PackageIndex, repacked_wheels
from tests.support.servers import free_port
from tests.support.sshd_hosts import SshdHost, SshdLab

DDP = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "ddp" / "train.py"


def _job(folder: Path, index: PackageIndex, epochs: str) -> Path:
    """The 2-node x 1-process DDP job (its setup installs torch from ``index``)."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(DDP, folder / "train.py")
    spec = {
        "name": "bench-gang",
        "workload": {
            "kind": "distributed",
            "entrypoint": "train.py",
            "args": [epochs],
            "num_workers": 2,
            "procs_per_worker": 1,
            "comm_backend": "gloo",
            "rendezvous": {"port": free_port(), "join_timeout_seconds": 120},
        },
        "resources": {"cpu_cores": 1},
        "placement": {"target": "cloud", "providers": ["ssh"], "on_unschedulable": "fail"},
        "setup": {"pip": ["torch==2.13.0"], "index_url": index.url, "timeout_seconds": 900},
    }
    path = folder / "job.json"
    path.write_text(json.dumps(spec))
    return path


def _gang(controller: Controller, job: Path) -> tuple[float, str, dict[str, Any]]:
    """Submit the gang attached: (seconds to the CLI's exit, its output, its status)."""
    started = time.monotonic()
    # From the job's folder: its source travels with it.
    done = run_cli(["submit", "-f", str(job)], env=controller.env, cwd=job.parent, timeout=900)
    took = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"the gang failed: {done.stderr[-2000:]}")
    job_id = controller.json("ls", "-n", "1")[0]["id"]
    return took, done.stdout + done.stderr, controller.json("status", job_id)


def _torch_python(host: SshdHost, root: Path) -> str:
    """The interpreter of the gang's setup environment on ``host``: plain torchrun uses the
    same one."""
    found = host.run(["sh", "-c", f"find {root} -path '*/bin/python' 2>/dev/null"]).stdout
    for python in found.split():
        if host.run([python, "-c", "import torch"]).returncode == 0:
            return python
    raise SystemExit(f"no interpreter with torch under {root} on {host.name}")


def _plain_torchrun(
    lab: SshdLab, hosts: list[SshdHost], pythons: list[str], iface: str, epochs: str
) -> float:
    """Two torchrun agents, one per host, started at once as gpulayer starts them."""
    port = free_port()
    code = base64.b64encode(DDP.read_bytes()).decode()
    agents = []
    start = time.monotonic()
    for rank, (host, python) in enumerate(zip(hosts, pythons, strict=True)):
        work = f"/tmp/plain-{port}-{rank}"
        script = (
            f"mkdir -p {work} && echo {code} | base64 -d > {work}/train.py && cd {work} && "
            f"GPULAYER_OUTPUT_DIR={work}/out GPULAYER_NODE_RANK={rank} GLOO_SOCKET_IFNAME={iface} "
            f"exec {python} -m torch.distributed.run --nnodes=2 --node-rank={rank} "
            f"--nproc-per-node=1 --rdzv-backend=static --master-addr={hosts[0].address} "
            f"--master-port={port} --rdzv-id=plain-{port} --local-addr={host.address} "
            f"--max-restarts=0 train.py {epochs}"
        )
        argv = lab.wrap(host, ["sh", "-c", script])
        agents.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = [agent.communicate(timeout=300)[0].decode() for agent in agents]
    took = time.monotonic() - start
    if "RANKINFO" not in "".join(outputs):
        raise SystemExit(f"plain torchrun failed: {outputs[0][-1500:]}")
    return took


def _at(value: str | None) -> float:
    return datetime.fromisoformat(value).timestamp() if value else float("nan")


def _breakdown(status: dict[str, Any], started: float, took: float) -> dict[str, float]:
    """Where a warm gang's time went, from its record: submit to its attempts' creation
    (placement: the take, dispatch), to the first attempt's start (the workers claim it and
    start), the attempts' run (setup and torchrun), and from the last end to the CLI's exit."""
    attempts = status["attempts"]
    created = _at(status.get("created_at"))
    first_start = min(_at(a["started_at"]) for a in attempts)
    last_end = max(_at(a["finished_at"]) for a in attempts)
    setup = max(a.get("setup_seconds") or 0.0 for a in attempts)
    return {
        "submit -> attempts started": first_start - created,
        "setup environment (reused)": setup,
        "attempts running (torchrun, DDP)": last_end - first_start - setup,
        "last attempt end -> CLI exit": started + took - last_end,
    }


def compare_on_hosts(repeats: int, epochs: str) -> None:
    with tempfile.TemporaryDirectory(prefix="gpulayer-bench-gang-hosts-") as scratch:
        base = Path(scratch)
        lab = SshdLab.create(base / "lab")
        try:
            if not lab.namespaced:
                raise SystemExit("needs root and iproute2: the hosts are network namespaces")
            hosts = lab.add_hosts(2)
            with PackageIndex(repacked_wheels("torch"), address=lab.gateway) as index:
                _compare(base, lab, hosts, index, repeats, epochs)
        finally:
            lab.close()


def _compare(
    base: Path,
    lab: SshdLab,
    hosts: list[SshdHost],
    index: PackageIndex,
    repeats: int,
    epochs: str,
) -> None:
    home = base / "home"
    home.mkdir()
    controller = Controller(home, {})
    root = base / "installs"
    config = {
        "ssh": {
            "hosts": [ssh_entry(h, f"g{i}", root) for i, h in enumerate(hosts)],
            "state_dir": str(base / "ssh-state"),
            "idle_seconds": 3600,
        },
        "gpulayer": {
            "deadman_seconds": 600,
            "deadman_action": f"record:{base / 'deadman.jsonl'}",
            "ssh_cidr": "127.0.0.1/32",
        },
    }
    (home / "providers.yaml").write_text(yaml.safe_dump(config))
    controller.prebuild_wheelhouse()
    try:
        cold, output, _ = _gang(controller, _job(base / "job-0", index, epochs))
        report = next(
            json.loads(line.split("RANKINFO ", 1)[1])
            for line in output.splitlines()
            if "RANKINFO " in line
        )
        iface = report["env"]["GLOO_SOCKET_IFNAME"]
        wait_for(
            lambda: sum(i["state"] == "idle" for i in controller.json("instances")) == 2,
            120,
            "both hosts to go idle",
        )
        pythons = [_torch_python(host, root) for host in hosts]
        warm: list[float] = []
        plain: list[float] = []
        parts: list[dict[str, float]] = []
        for n in range(repeats):
            started = time.time()
            took, output, status = _gang(controller, _job(base / f"job-{n + 1}", index, epochs))
            if "no launch and no bootstrap" not in output:
                raise SystemExit("the measured gang did not run on the warm hosts")
            warm.append(took)
            parts.append(_breakdown(status, started, took))
            wait_for(
                lambda: sum(i["state"] == "idle" for i in controller.json("instances")) == 2,
                120,
                "both hosts to go idle",
            )
            plain.append(_plain_torchrun(lab, hosts, pythons, iface, epochs))
        controller.run("reap")
    finally:
        controller.stop()
    gang, bare = statistics.median(warm), statistics.median(plain)
    print(f"2 honest hosts, 2 nodes x 1 process DDP, {epochs} epochs (median of {repeats})")
    print(f"  first gang (launch, bootstrap, setup):  {cold:6.2f} s (not compared)")
    print(f"  plain torchrun (2 agents, same python):  {bare:6.2f} s")
    print(f"  gang on the warm hosts:                  {gang:6.2f} s   ratio: {gang / bare:5.2f}x")
    print("  where the warm gang's time went (medians):")
    for key in parts[0]:
        print(f"    {key:<36}{statistics.median(p[key] for p in parts):6.2f} s")
