"""`gpulayer submit --target cloud` end to end, on ssh-provider hosts that are real sshd hosts,
machines of their own: rent, bootstrap over SSH, run, tear down; and the faults around it.

A host shares no disk and no process table with this machine: install dirs, processes and the
dead-man switch's record are looked for on the host. The hosts still share this kernel, so the
dead-man switch only records what it would do.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from tests.e2e_cloud.journey import last_job, ledger, wait_until
from tests.support.cli import run_cli
from tests.support.daemon import pid_alive
from tests.support.sshd_hosts import SshdHost

PYTHON = "python3"  # a test host is a machine of its own: its own python3


def write_providers(home: Path, hosts: list[dict[str, Any]], **orchestrator: Any) -> None:
    # Test hosts of earlier tests had the same addresses with other host keys: a state dir of
    # this test's own keeps the provider's first-contact host keys apart.
    state_dir = Path(hosts[0]["install_root"]).parent / "ssh-provider-state"
    config = {
        "ssh": {"hosts": hosts, "state_dir": str(state_dir)},
        "gpulayer": {"deadman_seconds": 600, "ssh_cidr": "127.0.0.1/32", **orchestrator},
    }
    (home / "providers.yaml").write_text(yaml.safe_dump(config))


def host_entry(
    host: SshdHost, name: str, price: float | None, install_root: Path, **extra: Any
) -> dict[str, Any]:
    """``install_root`` is a path on the host: the bootstrap makes it there."""
    entry = {
        "name": name,
        "address": host.address,
        "port": host.port,
        "user": host.user,
        "key_path": str(host.client_key),
        "authorized_keys": str(host.authorized_keys),  # where this test host's sshd looks
        "hourly_price": price,
        "region": "lab",
        "python": PYTHON,
        "install_root": str(install_root),
    }
    entry.update(extra)
    return entry


def job_processes(install_root: Path, *hosts: SshdHost) -> list[int]:
    """Processes on ``hosts`` (by their own pids) whose command line names ``install_root``."""
    return [pid for host in hosts for pid in host.processes_mentioning(str(install_root))]


def test_cloud_job_runs_on_a_rented_host_and_is_torn_down(
    ssh_hosts: Any, cloud_home: Path, tmp_path: Path
) -> None:
    (host,) = ssh_hosts(1)
    root = tmp_path / "installs"
    write_providers(cloud_home, [host_entry(host, "box1", 0.5, root)])
    # Installed providers that are not enabled list their catalogs too, marked so.
    offers = [o for o in json.loads(run_cli(["offers", "--json"]).stdout) if o["enabled"]]
    assert [(o["provider"], o["instance_type"], o["hourly_price"]) for o in offers] == [
        ("ssh", "box1", 0.5)
    ]

    script = (
        "import socket, os; print('ran on', socket.gethostname(), os.environ['GPULAYER_JOB_ID'])"
    )
    result = run_cli(["submit", "--target", "cloud", "--", "python", "-c", script], timeout=300)
    assert result.returncode == 0, result.stderr
    job = last_job()
    assert job["state"] == "succeeded"
    assert f"ran on {host.name} {job['id']}" in result.stdout
    assert "bootstrapping the worker" in result.stderr  # bootstrap phases land in the job's logs
    worker = job["attempts"][0]
    assert worker["worker_name"].startswith("r-")

    # The job's end is reported at once; teardown follows in the control plane.
    wait_until(lambda: ledger(job["id"])["instances"][0]["state"] == "terminated", what="teardown")
    costs = ledger(job["id"])
    (instance,) = costs["instances"]
    assert instance["provider"] == "ssh" and instance["state"] == "terminated"
    assert instance["launched_at"] and instance["ready_at"] and instance["ended_at"]
    assert instance["cost"] is not None and instance["cost"] >= 0
    assert costs["total"]["USD"] == instance["cost"]
    assert "cost" in run_cli(["status", job["id"]]).stdout

    assert host.exists(root)  # the bootstrap installed there ...
    assert not host.exists(root / job["id"])  # ... and the job's install dir is gone
    assert job_processes(root, host) == []
    assert not list((cloud_home / "keys").glob("r-*"))  # the per-instance key pair is removed
    again = [o for o in json.loads(run_cli(["offers", "--json"]).stdout) if o["enabled"]]
    assert [o["instance_type"] for o in again] == ["box1"]  # the host is free again


def test_a_cap_below_every_offer_fails_at_once_naming_the_cheapest(
    ssh_hosts: Any, cloud_home: Path, tmp_path: Path
) -> None:
    first, second = ssh_hosts(2)
    write_providers(
        cloud_home,
        [
            host_entry(first, "cheap", 0.4, tmp_path / "a"),
            host_entry(second, "dear", 3.0, tmp_path / "b"),
        ],
    )
    started = time.monotonic()
    result = run_cli(
        ["submit", "--target", "cloud", "--max-hourly-cost", "0.1", "--", "true"], timeout=120
    )
    assert result.returncode == 1
    assert time.monotonic() - started < 60
    assert "max_hourly_cost 0.1 USD is below every offer" in result.stderr
    assert "cheap" in result.stderr and "0.4" in result.stderr
    job = last_job()
    assert job["state"] == "failed" and job["reason"] == "unschedulable"
    assert ledger(job["id"])["instances"] == []  # nothing was rented


def test_a_host_whose_bootstrap_fails_gives_way_to_the_next_offer(
    ssh_hosts: Any, cloud_home: Path, tmp_path: Path
) -> None:
    broken, good = ssh_hosts(2)
    write_providers(
        cloud_home,
        [
            # Described, not probed: it is offered, and its bootstrap then fails.
            host_entry(
                broken,
                "broken",
                0.2,
                tmp_path / "broken",
                python="/nonexistent/python3",
                hardware={"cpu_cores": 2, "memory_gb": 4},
            ),
            host_entry(good, "good", 0.9, tmp_path / "good"),
        ],
    )
    result = run_cli(
        ["submit", "--target", "cloud", "--", "python", "-c", "print('second try')"], timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "second try" in result.stdout
    assert "broken" in result.stderr and "trying the next offer" in result.stderr
    job = last_job()
    wait_until(
        lambda: all(i["state"] == "terminated" for i in ledger(job["id"])["instances"]),
        what="teardown",
    )
    instances = ledger(job["id"])["instances"]
    assert [(i["instance_id"], i["state"]) for i in instances] == [
        ("broken", "terminated"),
        ("good", "terminated"),
    ]
    assert job_processes(tmp_path, broken, good) == []
    assert not good.exists(tmp_path / "good" / job["id"])


def test_ssh_refused_at_first_is_waited_out(
    ssh_hosts: Any, cloud_home: Path, tmp_path: Path
) -> None:
    (host,) = ssh_hosts(1)
    hardware = {"cpu_cores": 2, "memory_gb": 4}
    write_providers(
        cloud_home, [host_entry(host, "late", 0.5, tmp_path / "late", hardware=hardware)]
    )
    host.stop()
    host.start(delay=4)  # sshd comes up a few seconds after the job is submitted
    result = run_cli(
        ["submit", "--target", "cloud", "--", "python", "-c", "print('reached')"], timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "reached" in result.stdout
    job = last_job()
    wait_until(lambda: ledger(job["id"])["instances"][-1]["state"] == "terminated", what="teardown")


def test_ctrl_c_mid_job_cancels_and_tears_down(
    ssh_hosts: Any, cloud_home: Path, tmp_path: Path
) -> None:
    (host,) = ssh_hosts(1)
    root = tmp_path / "installs"
    write_providers(cloud_home, [host_entry(host, "box", 0.5, root)])
    script = "import time; print('started', flush=True); time.sleep(600)"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpulayer",
            "submit",
            "--target",
            "cloud",
            "--",
            "python",
            "-c",
            script,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    while line and "started" not in line:
        line = process.stdout.readline()
    assert "started" in line
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    job = last_job()
    assert job["state"] == "cancelled"
    wait_until(lambda: ledger(job["id"])["instances"][0]["state"] == "terminated", what="teardown")
    wait_until(lambda: not job_processes(root, host), what="the job's processes to end")
    assert host.exists(root)
    assert not host.exists(root / job["id"])


def test_controller_killed_mid_job_reaper_and_dead_man_switch(
    ssh_hosts: Any, cloud_home: Path, tmp_path: Path
) -> None:
    (host,) = ssh_hosts(1)
    root = tmp_path / "installs"
    record = root / "deadman.jsonl"  # on the host, beside the install dir
    write_providers(
        cloud_home,
        [host_entry(host, "box", 0.5, root)],
        deadman_seconds=6,
        deadman_action=f"record:{record}",
    )
    job_id = run_cli(
        ["submit", "-d", "--target", "cloud", "--", "python", "-c", "import time; time.sleep(600)"]
    ).stdout.strip()
    wait_until(lambda: last_job()["state"] == "running", timeout=180, what="the job to run")
    daemon_pid = json.loads((cloud_home / "server.json").read_text())["pid"]
    os.kill(daemon_pid, signal.SIGKILL)  # the controller dies; the instance is left behind
    wait_until(lambda: not pid_alive(daemon_pid), what="the controller to die")

    # The worker loses its tunnel: the dead-man switch ends the job and (here) records the action.
    entry = json.loads(
        wait_until(
            lambda: host.exists(record) and host.read_text(record).strip(),
            what="the dead-man switch",
        )
    )
    assert entry["action"] == "poweroff-or-stop"
    (cloud_home / "server.json").unlink(missing_ok=True)

    # The next command starts a new control plane, whose reaper ends the orphaned instance.
    run_cli(["reap", "--json"])
    wait_until(
        lambda: {i["state"] for i in ledger(job_id)["instances"]} == {"terminated"},
        what="the reaper",
    )
    job = json.loads(run_cli(["status", job_id, "--json"]).stdout)
    assert (job["state"], job["reason"]) == ("failed", "worker_lost"), job.get("message")
    wait_until(lambda: not job_processes(root, host), what="the worker to be gone")
    assert not host.exists(root / job_id)
