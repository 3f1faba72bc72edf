"""The cloud lifecycle on ssh-provider hosts (real sshd hosts, machines of their own): the
controller killed with -9 in each phase resumes where it was, jobs wait for busy hosts, and
nothing is left behind (keys, SSH sessions, workers, claims).

Each job waits on a gate file on its host, which the test makes there (the host shares no disk
with this machine), so a test decides when it ends. The dead-man switch only records what it
would do.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e_cloud.journey import ledger, wait_until
from tests.e2e_cloud.test_cloud_ssh_journey import host_entry, job_processes, write_providers
from tests.support.cli import run_cli
from tests.support.daemon import pid_alive
from tests.support.sshd_hosts import SshdHost, SshdLab

pytestmark = pytest.mark.slow


def gated_script(gate: Path, marker: str) -> str:
    return (
        "import os, time, pathlib\n"
        f"print('started {marker}', flush=True)\n"
        f"gate = pathlib.Path({str(gate)!r})\n"
        "while not gate.exists(): time.sleep(0.1)\n"
        f"print('finished {marker}', flush=True)\n"
    )


def submit_gated(gate: Path, marker: str, *extra: str) -> str:
    result = run_cli(
        [
            "submit",
            "-d",
            "--target",
            "cloud",
            *extra,
            "--",
            "python",
            "-c",
            gated_script(gate, marker),
        ]
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def open_gate(gate: Path, *hosts: SshdHost) -> None:
    """Make ``gate`` on each of ``hosts``: a job waiting for it there goes on."""
    make = 'mkdir -p "$(dirname "$1")" && touch "$1"'
    for host in hosts:
        host.run(["sh", "-c", make, "sh", str(gate)], check=True)


def status(job_id: str) -> dict[str, Any]:
    return dict(json.loads(run_cli(["status", job_id, "--json"]).stdout))


def instances(*args: str) -> list[dict[str, Any]]:
    result = run_cli(["instances", "--json", *args])
    assert result.returncode == 0, result.stderr
    return list(json.loads(result.stdout))


def logs(job_id: str) -> str:
    return run_cli(["logs", job_id]).stderr + run_cli(["logs", job_id]).stdout


def kill_controller(home: Path) -> None:
    pid = json.loads((home / "server.json").read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), what="the controller to die")
    (home / "server.json").unlink(missing_ok=True)


def state_of(job_id: str) -> str | None:
    found = instances("--job", job_id)
    live = [i for i in found if i["state"] not in ("terminated", "never_launched")]
    return live[-1]["state"] if live else None


def assert_nothing_left(
    home: Path, job_ids: str | list[str], root: Path, lab: SshdLab, *hosts: SshdHost
) -> None:
    gone = {"terminated", "never_launched"}
    for job_id in [job_ids] if isinstance(job_ids, str) else job_ids:
        wait_until(
            lambda j=job_id: {i["state"] for i in ledger(j)["instances"]} <= gone,
            what="teardown",
        )
        for host in hosts:
            assert not host.exists(root / job_id), f"{root / job_id} left on {host.name}"
    wait_until(lambda: not job_processes(root, *hosts), what="the job's processes to end")
    assert not list((home / "keys").glob("r-*"))  # key pairs and pinned host keys
    for host in hosts:
        # Only the listening sshd is left on the host: every session of ours was closed.
        wait_until(lambda h=host: not h.session_pids(), what=f"sessions on {host.name} to close")


def running_on_one_host(
    ssh_hosts: Any, home: Path, tmp_path: Path, name: str, marker: str
) -> tuple[SshdHost, Path, Path, str]:
    """One host in providers.yaml and a gated job running on it: (host, root, gate, job)."""
    (host,) = ssh_hosts(1)
    root = tmp_path / "installs"
    write_providers(home, [host_entry(host, name, 0.5, root)])
    gate = tmp_path / "gate"
    job_id = submit_gated(gate, marker)
    wait_until(lambda: status(job_id)["state"] == "running", timeout=180, what="the job to run")
    return host, root, gate, job_id


def test_controller_killed_while_the_job_runs_resumes_it(
    ssh_hosts: Any, sshd_lab: SshdLab, cloud_home: Path, tmp_path: Path
) -> None:
    (host,) = ssh_hosts(1)
    root = tmp_path / "installs"
    record = root / "deadman.jsonl"  # where the dead-man switch would write, on the host
    write_providers(
        cloud_home, [host_entry(host, "box", 0.5, root)], deadman_action=f"record:{record}"
    )
    gate = tmp_path / "gate"
    job_id = submit_gated(gate, "resumed")
    wait_until(lambda: status(job_id)["state"] == "running", timeout=180, what="the job to run")
    (before,) = instances("--job", job_id)
    assert before["state"] == "in_use"
    kill_controller(cloud_home)

    # The next command starts a new control plane, which reopens the tunnel to the instance.
    wait_until(lambda: "SSH tunnel reopened" in logs(job_id), timeout=60, what="the tunnel")
    open_gate(gate, host)
    wait_until(lambda: status(job_id)["state"] == "succeeded", timeout=120, what="the job")
    job = status(job_id)
    (attempt,) = job["attempts"]
    assert attempt["state"] == "succeeded" and attempt["finished_at"]
    assert "finished resumed" in run_cli(["logs", job_id]).stdout
    assert_nothing_left(cloud_home, job_id, root, sshd_lab, host)
    (after,) = ledger(job_id)["instances"]  # one instance, rented once
    assert after["request_id"] == before["request_id"]
    assert host.exists(root)
    assert not host.exists(record)  # the worker never gave its control plane up
    phases = [p["phase"] for p in status(job_id)["instances"][0]["phases"]]
    assert phases[:3] == ["provision", "ssh", "bootstrap"] and "run" in phases
    assert phases[-1] == "teardown"
    rendered = run_cli(["status", job_id]).stdout
    assert "bootstrap" in rendered and "teardown" in rendered


def test_controller_killed_mid_bootstrap_starts_the_bootstrap_over(
    ssh_hosts: Any, sshd_lab: SshdLab, cloud_home: Path, tmp_path: Path
) -> None:
    (host,) = ssh_hosts(1)
    root = tmp_path / "installs"
    write_providers(cloud_home, [host_entry(host, "box", 0.5, root)])
    gate = tmp_path / "gate"
    open_gate(gate, host)
    job_id = submit_gated(gate, "bootstrapped")
    wait_until(lambda: state_of(job_id) == "bootstrapping", timeout=120, what="the bootstrap")
    kill_controller(cloud_home)

    wait_until(lambda: status(job_id)["state"] == "succeeded", timeout=240, what="the job")
    assert "finished bootstrapped" in run_cli(["logs", job_id]).stdout
    assert_nothing_left(cloud_home, job_id, root, sshd_lab, host)
    (instance,) = status(job_id)["instances"]
    moves = [(h["from"], h["to"]) for h in instance["history"]]
    assert ("bootstrapping", "booting") in moves  # started over on the same instance
    assert moves[-1] == ("terminating", "terminated")


def test_controller_killed_mid_launch_launches_the_same_request_again(
    ssh_hosts: Any, sshd_lab: SshdLab, cloud_home: Path, tmp_path: Path
) -> None:
    (host,) = ssh_hosts(1)
    root = tmp_path / "installs"
    hardware = {"cpu_cores": 2, "memory_gb": 4}  # described, so offered while SSH is down
    write_providers(cloud_home, [host_entry(host, "late", 0.5, root, hardware=hardware)])
    host.stop()  # the launch waits for SSH to answer
    gate = tmp_path / "gate"
    job_id = submit_gated(gate, "launched")
    wait_until(lambda: state_of(job_id) == "launching", timeout=60, what="the launch")
    kill_controller(cloud_home)
    host.start()
    open_gate(gate, host)  # after the restart, which empties the host's /tmp

    wait_until(lambda: status(job_id)["state"] == "succeeded", timeout=240, what="the job")
    assert_nothing_left(cloud_home, job_id, root, sshd_lab, host)
    (instance,) = ledger(job_id)["instances"]  # launched again under the same request id
    assert instance["instance_id"] == "late"


def test_controller_killed_during_teardown_finishes_it(
    ssh_hosts: Any, sshd_lab: SshdLab, cloud_home: Path, tmp_path: Path
) -> None:
    host, root, gate, job_id = running_on_one_host(
        ssh_hosts, cloud_home, tmp_path, "box", "torn-down"
    )
    host.stop_listening()  # the job goes on; the provider's terminate cannot connect
    open_gate(gate, host)
    wait_until(lambda: status(job_id)["state"] == "succeeded", timeout=120, what="the job")
    wait_until(lambda: state_of(job_id) == "terminating", timeout=60, what="the teardown")
    kill_controller(cloud_home)
    host.start()

    run_cli(["reap", "--json"])  # a new control plane, told to try now
    assert_nothing_left(cloud_home, job_id, root, sshd_lab, host)
    offered = json.loads(run_cli(["offers", "--json"]).stdout)
    assert [o["instance_type"] for o in offered if o["provider"] == "ssh"] == ["box"]  # freed
    assert instances() == []
    (instance,) = instances("--all", "--job", job_id)
    assert instance["state"] == "terminated"


def test_three_jobs_on_two_hosts_all_succeed(
    ssh_hosts: Any, sshd_lab: SshdLab, cloud_home: Path, tmp_path: Path
) -> None:
    first, second = ssh_hosts(2)
    root = tmp_path / "installs"
    write_providers(
        cloud_home,
        [host_entry(first, "one", 0.5, root / "one"), host_entry(second, "two", 0.6, root / "two")],
    )
    gates = [tmp_path / f"gate-{i}" for i in range(3)]
    jobs = [submit_gated(gate, f"job{i}") for i, gate in enumerate(gates)]
    wait_until(
        lambda: sorted(status(j)["state"] for j in jobs) == ["queued", "running", "running"],
        timeout=240,
        what="two jobs running, one waiting",
    )
    (waiting,) = [j for j in jobs if status(j)["state"] == "queued"]
    view = status(waiting)
    assert view["message"].startswith("waiting for capacity: 2 offer(s) busy")
    assert "in use by job" in view["message"]
    assert "waiting for capacity" in run_cli(["status", waiting]).stdout
    # A gate on both hosts: which host runs which job is the scheduler's choice.
    for i, job_id in enumerate(jobs):
        if job_id != waiting:
            open_gate(gates[i], first, second)
    open_gate(gates[jobs.index(waiting)], first, second)
    for job_id in jobs:
        wait_until(lambda j=job_id: status(j)["state"] == "succeeded", timeout=240, what=job_id)
    assert_nothing_left(cloud_home, jobs, root, sshd_lab, first, second)
    for job_id in jobs:
        # One machine each, and no job reached for a host another held: jobs planned at the
        # same instant get two hosts or one waits (no refused launch was needed).
        rows = ledger(job_id)["instances"]
        assert [i["state"] for i in rows] == ["terminated"], rows

    # Their workers are gone with their machines: hidden unless asked for.
    shown = json.loads(run_cli(["workers", "--json"]).stdout)
    assert all(w["kind"] != "cloud" for w in shown)
    everything = json.loads(run_cli(["workers", "--all", "--json"]).stdout)
    assert sum(1 for w in everything if w["kind"] == "cloud" and w["state"] == "gone") >= 3


def test_a_busy_pool_fails_at_once_when_the_job_says_so(
    ssh_hosts: Any, sshd_lab: SshdLab, cloud_home: Path, tmp_path: Path
) -> None:
    host, root, gate, holder = running_on_one_host(
        ssh_hosts, cloud_home, tmp_path, "only", "holder"
    )
    spec = {
        "workload": {"kind": "command", "command": ["true"]},
        "placement": {"target": "cloud", "on_unschedulable": "fail"},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    result = run_cli(["submit", "-f", str(tmp_path / "job.yaml")], timeout=120)
    assert result.returncode == 1
    assert "no capacity: 1 offer(s) busy" in result.stderr
    assert f"in use by job {holder}" in result.stderr
    open_gate(gate, host)
    wait_until(lambda: status(holder)["state"] == "succeeded", timeout=120, what="the first job")
    assert_nothing_left(cloud_home, holder, root, sshd_lab, host)


def test_a_failed_bootstrap_leaves_no_session_and_no_key(
    ssh_hosts: Any, sshd_lab: SshdLab, cloud_home: Path, tmp_path: Path
) -> None:
    (host,) = ssh_hosts(1)
    root = tmp_path / "installs"
    write_providers(
        cloud_home,
        [
            host_entry(
                host,
                "broken",
                0.2,
                root,
                python="/nonexistent/python3",
                hardware={"cpu_cores": 2, "memory_gb": 4},
            )
        ],
    )
    result = run_cli(["submit", "--target", "cloud", "--", "true"], timeout=240)
    assert result.returncode == 1
    assert "every offer failed" in result.stderr
    job = json.loads(run_cli(["ls", "--json", "-n", "1"]).stdout)[0]
    assert job["reason"] == "unschedulable"
    assert_nothing_left(cloud_home, job["id"], root, sshd_lab, host)
