"""Jobs through the command line on the real cluster: an allocation per job, the worker inside
it, nothing left in squeue after."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e_cloud.journey import last_job, ledger, wait_until, why_it_failed
from tests.e2e_cloud.test_cloud_ssh_journey import host_entry, job_processes
from tests.integration.slurm.conftest import slurm_section
from tests.support.cli import run_cli
from tests.support.daemon import pid_alive, stop_local_control_plane
from tests.support.package_index import PackageIndex, repacked_wheels
from tests.support.procs import processes_with
from tests.support.slurm_cluster import SlurmCluster, SlurmClusterError
from tests.support.sshd_hosts import HostFactory, ssh_hosts, sshd_lab

__all__ = ["ssh_hosts", "sshd_lab"]  # a rented machine beside the cluster, in a lab of its own

pytestmark = pytest.mark.slow


def installs(tmp_path: Path) -> str:
    """The test's install root on the nodes' own disks (a name no other test uses)."""
    return f"/var/tmp/gpulayer-{tmp_path.name}"


def shared_file(cluster: SlurmCluster, tmp_path: Path, name: str) -> tuple[Path, str]:
    """A file of the cluster's shared filesystem for this test: where this machine sees it,
    and where a job on a node does."""
    here = cluster.shared / tmp_path.name / name
    here.parent.mkdir(parents=True, exist_ok=True)
    return here, str(cluster.on_nodes(here))


def no_worker_installs(cluster: SlurmCluster, tmp_path: Path, job_id: str | None = None) -> bool:
    """No worker of this test runs anywhere, and (for ``job_id``) its install is gone from
    every node."""
    if processes_with(installs(tmp_path)):
        return False
    return job_id is None or not any(
        host.exists(f"{installs(tmp_path)}/{job_id}") for host in cluster.hosts.values()
    )


def write_providers(
    home: Path,
    cluster: SlurmCluster,
    tmp_path: Path,
    *,
    provider: dict[str, Any] | None = None,
    controller: dict[str, Any] | None = None,
    others: dict[str, Any] | None = None,
    **extra: Any,
) -> None:
    """The test cluster with a priced cpu partition; the worker runs on the nodes' own
    python. ``provider``: more settings of the slurm section (``extra``: of the cluster),
    ``controller``: of gpulayer's, ``others``: other providers' sections."""
    section = slurm_section(
        cluster,
        authorized_keys=str(cluster.on_nodes(cluster.shared_authorized_keys)),
        install_root=installs(tmp_path),
        python="/usr/bin/python3",
        hourly_price={"gpu": 2.5, "cpu": 0.6},
        **extra,
    )
    section["state_dir"] = str(tmp_path / "slurm-state")
    section.update(provider or {})
    config = {
        **(others or {}),
        "slurm": section,
        "gpulayer": {
            "deadman_seconds": 600,
            "ssh_cidr": f"{cluster.lab.gateway}/32",
            **(controller or {}),
        },
    }
    (home / "providers.yaml").write_text(yaml.safe_dump(config))


def test_a_job_runs_in_an_allocation_and_leaves_nothing_in_squeue(
    slurm_cluster: SlurmCluster, slurm_home: Path, tmp_path: Path
) -> None:
    write_providers(slurm_home, slurm_cluster, tmp_path)
    # The job names the processes it runs under: the worker's, then the allocation's step.
    script = (
        "import os\n"
        "print('ran', os.environ['GPULAYER_JOB_ID'])\n"
        "names, pid = [], os.getppid()\n"
        "while pid > 1:\n"
        "    names.append(open(f'/proc/{pid}/comm').read().strip())\n"
        "    pid = int(open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[1])\n"
        "print('under', ' '.join(names))\n"
    )
    result = run_cli(
        ["submit", "--target", "cloud", "--provider", "slurm", "--timeout", "120", "--",
         "python3", "-c", script],
        timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    job = last_job()
    assert job["state"] == "succeeded"
    assert f"ran {job['id']}" in result.stdout
    # The worker runs inside the allocation: Slurm's step started it, not an SSH session.
    under = next(line for line in result.stdout.splitlines() if line.startswith("under "))
    assert "slurmstepd" in under.split() and "sshd" not in under.split(), under
    assert "slurm job" in result.stderr and "submitted to" in result.stderr
    # The node refuses this machine's logins: the bootstrap went through the login node.
    assert slurm_cluster.login is not None
    assert f" via {slurm_cluster.login.target()}" in result.stderr, result.stderr[-3000:]
    wait_until(lambda: ledger(job["id"])["instances"][0]["state"] == "terminated", what="teardown")
    costs = ledger(job["id"])
    (instance,) = costs["instances"]
    assert instance["provider"] == "slurm" and instance["region"] == f"{slurm_cluster.name}/cpu"
    # The ledger has the node-hours at the partition's price.
    assert instance["hourly_price"] == 0.6 and instance["cost"] > 0
    assert costs["total"]["USD"] == instance["cost"]
    assert slurm_cluster.queue() == []
    wait_until(
        lambda: no_worker_installs(slurm_cluster, tmp_path, job["id"]),
        timeout=30,
        what="the worker and its install to go",
    )


def test_a_cap_below_the_partition_price_is_refused(
    slurm_cluster: SlurmCluster, slurm_home: Path, tmp_path: Path
) -> None:
    write_providers(slurm_home, slurm_cluster, tmp_path)
    refused = run_cli(
        ["submit", "--target", "cloud", "--provider", "slurm", "--max-hourly-cost", "0.5",
         "--", "true"],
        timeout=120,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "0.6" in refused.stderr, refused.stderr
    assert slurm_cluster.queue() == []


DDP_TRAIN = Path(__file__).parents[2] / "fixtures" / "ddp" / "train.py"


@pytest.fixture(scope="module")
def cluster_torch_index(slurm_cluster: SlurmCluster) -> Iterator[PackageIndex]:
    """torch served where the cluster's nodes reach it: their python has none."""
    try:
        wheels = repacked_wheels("torch")
    except Exception as exc:  # torch not installed here, or not repackable
        pytest.skip(f"no torch wheels to serve: {exc}")
    with PackageIndex(wheels, address=slurm_cluster.lab.gateway) as served:
        yield served


def test_a_two_node_gloo_gang_is_one_allocation(
    slurm_cluster: SlurmCluster,
    slurm_home: Path,
    tmp_path: Path,
    cluster_torch_index: PackageIndex,
) -> None:
    # The cluster's shared filesystem holds the wheels for both nodes (shared_dir).
    shared = slurm_cluster.shared / tmp_path.name / "software"
    shared.mkdir(parents=True)
    write_providers(
        slurm_home, slurm_cluster, tmp_path, shared_dir=str(slurm_cluster.on_nodes(shared))
    )
    folder = tmp_path / "src"
    folder.mkdir()
    shutil.copy(DDP_TRAIN, folder / "train.py")
    spec = {
        "name": "slurm-gang",
        "workload": {
            "kind": "distributed",
            "entrypoint": "train.py",
            "args": ["3"],
            "num_workers": 2,
            "procs_per_worker": 1,
            "comm_backend": "gloo",
            "rendezvous": {"join_timeout_seconds": 60},
        },
        "resources": {"cpu_cores": 1},
        "timeout_seconds": 900,
        "placement": {"target": "cloud", "providers": ["slurm"], "on_unschedulable": "fail"},
        # The nodes' own python has no torch: the job brings it.
        "setup": {
            "pip": ["torch==2.13.0"],
            "index_url": cluster_torch_index.url,
            "timeout_seconds": 900,
        },
    }
    (folder / "job.json").write_text(json.dumps(spec))
    result = run_cli(["submit", "-f", str(folder / "job.json")], cwd=folder, timeout=900)
    job = last_job()
    assert result.returncode == 0, f"{why_it_failed(result.stderr)}\n{job}"
    ranks = [
        json.loads(line.split("RANKINFO ", 1)[1])
        for line in (result.stdout + result.stderr).splitlines()
        if "RANKINFO " in line
    ]
    assert sorted(r["rank"] for r in ranks) == [0, 1] and {r["world"] for r in ranks} == {2}
    # Node 0 is SLURM_NODEID 0 (cpu1); the gang meets there.
    assert {r["env"]["MASTER_ADDR"] for r in ranks} == {slurm_cluster.hosts["cpu1"].address}
    assert "gang of 2 launched together" in result.stderr
    wait_until(
        lambda: {i["state"] for i in ledger(job["id"])["instances"]} == {"terminated"},
        what="the gang's teardown",
    )
    instances = ledger(job["id"])["instances"]
    assert len(instances) == 2 and len({i["instance_id"] for i in instances}) == 2
    assert slurm_cluster.queue() == []
    (kept,) = (shared / "wheelhouse").iterdir()
    assert any(w.name.startswith("gpulayer-") for w in kept.glob("*.whl"))
    assert not list(kept.glob(".*.part-*"))  # each wheel whole, whichever node placed it
    assert not any(
        host.exists(f"{installs(tmp_path)}/wheelhouse") for host in slurm_cluster.hosts.values()
    )


def no_job_keys(cluster: SlurmCluster) -> bool:
    return "gpulayer-request:" not in cluster.shared_authorized_keys.read_text()


def submit_detached(*command: str, timeout: int = 120) -> str:
    sent = run_cli(
        ["submit", "--target", "cloud", "--provider", "slurm", "--timeout", str(timeout),
         "--detach", "--", *command],
    )  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    return str(last_job()["id"])


def status(job_id: str) -> dict[str, Any]:
    return dict(json.loads(run_cli(["status", job_id, "--json"]).stdout))


def test_pending_for_capacity_cancelled_while_pending_or_running(
    slurm_cluster: SlurmCluster, slurm_home: Path, tmp_path: Path
) -> None:
    write_providers(slurm_home, slurm_cluster, tmp_path)
    # Someone else's job holds every cpu node.
    holder = slurm_cluster.sbatch(
        "-p", "cpu", "-N", "2", "--exclusive", "-J", "someone-else", "--wrap", "sleep 300"
    )
    waiting = submit_detached("sleep", "300")
    job_id = submit_detached("sleep", "300")

    def waits_with_slurms_reason(job: str) -> bool:
        said = run_cli(["logs", job]).stderr
        return "waiting for capacity" in said and "is pending (" in said

    for job in (waiting, job_id):
        wait_until(
            lambda job=job: waits_with_slurms_reason(job),
            timeout=30,
            what="the allocation to wait",
        )
        shown = status(job)
        assert shown["state"] == "provisioning"
        assert shown["message"].startswith("waiting for capacity: slurm job"), shown["message"]
    assert len(slurm_cluster.queue()) == 3
    # Cancelled while it waits: its allocation leaves the queue, the other job's stays.
    assert run_cli(["cancel", waiting]).returncode == 0
    wait_until(
        lambda: len(slurm_cluster.queue()) == 2,
        timeout=30,
        what="the cancelled job's allocation to leave the queue",
    )
    assert status(waiting)["state"] == "cancelled"
    slurm_cluster.command("scancel", holder)
    wait_until(lambda: status(job_id)["state"] == "running", timeout=120, what="the job to run")
    cancelled = run_cli(["cancel", job_id])
    assert cancelled.returncode == 0, cancelled.stderr
    wait_until(lambda: status(job_id)["state"] == "cancelled", what="cancelled")
    wait_until(lambda: ledger(job_id)["instances"][0]["state"] == "terminated", what="teardown")
    wait_until(lambda: slurm_cluster.queue() == [], timeout=30, what="an empty queue")
    wait_until(lambda: no_job_keys(slurm_cluster), timeout=30, what="the jobs' keys to go")


@pytest.mark.parametrize("worker_from", ["ssh", "shared filesystem"])
def test_controller_killed_while_the_allocation_runs_resumes_it(
    slurm_cluster: SlurmCluster, slurm_home: Path, tmp_path: Path, worker_from: str
) -> None:
    """Also with the worker started from the shared filesystem: its tunnel on the login
    node's address is reopened on the same port."""
    shared = slurm_cluster.on_nodes(slurm_cluster.shared / tmp_path.name / "gpulayer")
    extra = {"shared_install_root": str(shared)} if worker_from != "ssh" else {}
    write_providers(slurm_home, slurm_cluster, tmp_path, **extra)
    gate, gate_on_nodes = shared_file(slurm_cluster, tmp_path, "gate")
    script = (
        "import pathlib, time\n"
        "print('started', flush=True)\n"
        f"while not pathlib.Path({gate_on_nodes!r}).exists(): time.sleep(0.1)\n"
        "print('finished resumed', flush=True)\n"
    )
    job_id = submit_detached("python3", "-c", script)
    wait_until(lambda: status(job_id)["state"] == "running", timeout=120, what="the job to run")
    (allocation,) = slurm_cluster.queue()
    pid = json.loads((slurm_home / "server.json").read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), what="the controller to die")
    (slurm_home / "server.json").unlink(missing_ok=True)

    # The next command starts a new control plane, which finds the allocation and its worker.
    wait_until(
        lambda: "SSH tunnel reopened" in run_cli(["logs", job_id]).stderr,
        timeout=60,
        what="the tunnel",
    )
    assert slurm_cluster.queue() == [allocation]  # the same allocation, still running
    gate.touch()
    wait_until(lambda: status(job_id)["state"] == "succeeded", timeout=60, what="the job")
    assert "finished resumed" in run_cli(["logs", job_id]).stdout
    wait_until(lambda: ledger(job_id)["instances"][0]["state"] == "terminated", what="teardown")
    assert len(ledger(job_id)["instances"]) == 1
    wait_until(lambda: slurm_cluster.queue() == [], timeout=30, what="an empty queue")
    wait_until(lambda: no_job_keys(slurm_cluster), timeout=30, what="the jobs' keys to go")


def test_pending_past_the_jobs_provisioning_timeout_ends_the_allocation(
    slurm_cluster: SlurmCluster, slurm_home: Path, tmp_path: Path
) -> None:
    write_providers(slurm_home, slurm_cluster, tmp_path)
    holder = slurm_cluster.sbatch(
        "-p", "cpu", "-N", "2", "--exclusive", "-J", "someone-else", "--wrap", "sleep 300"
    )
    spec = {
        "workload": {"kind": "command", "command": ["true"]},
        "placement": {
            "target": "cloud",
            "providers": ["slurm"],
            "max_hourly_cost": 1,  # the cpu partition only
            "on_unschedulable": "fail",
            "provisioning": {"provisioning_timeout_seconds": 5},
        },
    }
    (tmp_path / "job.json").write_text(json.dumps(spec))
    sent = run_cli(["submit", "-f", str(tmp_path / "job.json"), "--detach"])
    assert sent.returncode == 0, sent.stderr
    job_id = str(last_job()["id"])
    wait_until(
        lambda: "still pending after 5 s" in run_cli(["logs", job_id]).stderr,
        timeout=60,
        what="the launch to give up",
    )
    wait_until(
        lambda: [line.split()[0] for line in slurm_cluster.queue()] == [holder],
        timeout=30,
        what="the job's allocation to leave the queue",
    )
    assert run_cli(["cancel", job_id]).returncode == 0
    slurm_cluster.command("scancel", holder)
    wait_until(lambda: slurm_cluster.queue() == [], timeout=30, what="an empty queue")
    wait_until(lambda: no_job_keys(slurm_cluster), timeout=30, what="the jobs' keys to go")


def test_an_allocation_slurm_ends_under_the_job_is_a_lost_worker(
    slurm_cluster: SlurmCluster, slurm_home: Path, tmp_path: Path
) -> None:
    # As its time limit or an admin's scancel would: not gpulayer's doing, not a preemption.
    write_providers(slurm_home, slurm_cluster, tmp_path)
    job_id = submit_detached("sleep", "300")
    wait_until(lambda: status(job_id)["state"] == "running", timeout=120, what="the job to run")
    (allocation,) = slurm_cluster.queue()
    slurm_cluster.command("scancel", allocation.split()[0])
    wait_until(lambda: status(job_id)["state"] == "failed", timeout=60, what="the job to fail")
    assert status(job_id)["reason"] == "worker_lost"
    wait_until(lambda: ledger(job_id)["instances"][0]["state"] == "terminated", what="teardown")
    wait_until(lambda: slurm_cluster.queue() == [], timeout=30, what="an empty queue")
    wait_until(lambda: no_job_keys(slurm_cluster), timeout=30, what="the jobs' keys to go")
    # The worker, started inside the allocation, is stopped with it.
    wait_until(lambda: no_worker_installs(slurm_cluster, tmp_path), timeout=30, what="the worker")


def test_a_node_that_fails_under_the_job_is_a_lost_worker(
    slurm_cluster: SlurmCluster, slurm_home: Path, tmp_path: Path
) -> None:
    """The job's node drops off the network: the attempt ends ``worker_lost`` (whichever
    notices first, gpulayer's missed heartbeats or Slurm's NODE_FAIL), the instance is torn
    down without waiting on the node, Slurm marks the node down, and the worker, cut off on
    the node, ends itself and the job by its dead-man switch. Back on the network and
    resumed, the node returns to service."""
    # The worker's dead-man switch fires after 20 s without the control plane.
    write_providers(slurm_home, slurm_cluster, tmp_path, controller={"deadman_seconds": 20})
    job_id = submit_detached("sleep", "300", timeout=600)
    wait_until(lambda: status(job_id)["state"] == "running", timeout=120, what="the job to run")
    (allocation,) = slurm_cluster.queue()
    slurm_job = allocation.split()[0]
    node = slurm_cluster.command("squeue", "-h", "-o", "%N", "-j", slurm_job).strip()
    host = slurm_cluster.hosts[node]
    slurm_cluster.lab.unplug(host)
    try:
        wait_until(lambda: status(job_id)["state"] == "failed", timeout=120, what="the job to fail")
        assert status(job_id)["reason"] == "worker_lost", status(job_id)
        wait_until(lambda: ledger(job_id)["instances"][0]["state"] == "terminated", what="teardown")
        wait_until(
            lambda: slurm_cluster.node_states()[node].startswith("down"),
            timeout=120,
            what="Slurm to mark the node down",
        )
        wait_until(lambda: slurm_cluster.queue() == [], timeout=30, what="an empty queue")
        ended = wait_until(lambda: slurm_cluster.ended_as(slurm_job), timeout=30, what="sacct")
        assert ended in ("NODE_FAIL", "CANCELLED"), ended
        # Cut off, the worker stops by itself (its dead-man switch), the job's process with it.
        wait_until(
            lambda: not host.processes_mentioning("sleep 300"), timeout=90, what="the job's end"
        )
        # The worker itself gives its last reports their 30 s (and the job's grace) first.
        wait_until(
            lambda: no_worker_installs(slurm_cluster, tmp_path), timeout=120, what="the worker"
        )
    finally:
        slurm_cluster.lab.plug(host)
        # As an admin returns a repaired node to service.
        with contextlib.suppress(SlurmClusterError):
            slurm_cluster.command("scontrol", "update", f"NodeName={node}", "State=RESUME")
    slurm_cluster.wait_nodes_idle([node], timeout=60)
    wait_until(lambda: no_job_keys(slurm_cluster), timeout=30, what="the job's key to go")


def test_a_preempted_allocation_is_a_preempted_attempt_that_runs_again(
    slurm_cluster: SlurmCluster, slurm_home: Path, tmp_path: Path
) -> None:
    """A job of a higher-tier partition takes the node: Slurm cancels the allocation as
    PREEMPTED, the attempt ends ``preempted`` (not a lost worker) and, as its retry_on asks,
    the job runs again in a new allocation."""
    # Only the partitions offers were made of: the urgent one is someone else's. The retry
    # may queue on the same partition at once (by default a reclaimed offer is held back).
    write_providers(
        slurm_home,
        slurm_cluster,
        tmp_path,
        controller={"hold_reclaimed_seconds": 0},
        partitions=["gpu", "cpu"],
    )
    marker, marker_on_nodes = shared_file(slurm_cluster, tmp_path, "first-attempt-ran")
    script = (
        "import pathlib, time\n"
        f"marker = pathlib.Path({marker_on_nodes!r})\n"
        "if not marker.exists():\n"
        "    marker.write_text('x')\n"
        "    print('first attempt', flush=True)\n"
        "    time.sleep(300)\n"
        "print('second attempt')\n"
    )
    spec = {
        "workload": {"kind": "command", "command": ["python3", "-c", script]},
        "placement": {"target": "cloud", "providers": ["slurm"], "max_hourly_cost": 1},
        "retry": {"max_attempts": 2, "retry_on": ["preempted"]},
        "grace_seconds": 1,
        "timeout_seconds": 600,
    }
    (tmp_path / "job.json").write_text(json.dumps(spec))
    sent = run_cli(["submit", "-d", "-f", str(tmp_path / "job.json")])
    assert sent.returncode == 0, sent.stderr
    job_id = sent.stdout.strip()
    wait_until(marker.exists, timeout=120, what="the first attempt to run")
    (allocation,) = slurm_cluster.queue()
    first = allocation.split()[0]
    node = slurm_cluster.command("squeue", "-h", "-o", "%N", "-j", first).strip()
    slurm_cluster.command(
        "scontrol", "create", "PartitionName=urgent", "Nodes=cpu1,cpu2", "PriorityTier=2",
        "MaxTime=30:00", "State=UP",
    )  # fmt: skip
    urgent = ""
    try:
        urgent = slurm_cluster.sbatch(
            "-p", "urgent", "-w", node, "--exclusive", "-J", "urgent", "--wrap", "sleep 20"
        )
        wait_until(
            lambda: status(job_id)["state"] in ("succeeded", "failed"),
            timeout=180,
            what="the job to end",
        )
        ended = status(job_id)
        reasons = [(a["number"], a["state"], a["reason"]) for a in ended["attempts"]]
        assert reasons == [(1, "failed", "preempted"), (2, "succeeded", None)], (
            reasons,
            ended["message"],
            run_cli(["logs", job_id]).stderr[-2000:],
        )
        assert ended["state"] == "succeeded"
        said = run_cli(["logs", job_id])
        assert "second attempt" in said.stdout, said.stdout
        instances = ledger(job_id)["instances"]
        assert len(instances) == 2, instances
        wait_until(
            lambda: {i["state"] for i in ledger(job_id)["instances"]} == {"terminated"},
            what="both allocations to end",
        )
        # The first attempt's worker went with its allocation's node.
        wait_until(
            lambda: no_worker_installs(slurm_cluster, tmp_path),
            timeout=60,
            what="the workers",
        )
        assert all(line.split()[0] == urgent for line in slurm_cluster.queue())
    finally:
        if urgent:
            slurm_cluster.command("scancel", urgent)
        wait_until(lambda: slurm_cluster.queue() == [], timeout=30, what="an empty queue")
        slurm_cluster.command("scontrol", "delete", "PartitionName=urgent")
    wait_until(lambda: no_job_keys(slurm_cluster), timeout=30, what="the jobs' keys to go")


def test_a_job_past_its_timeout_ends_timeout_within_an_allocation_limited_to_it(
    slurm_cluster: SlurmCluster, slurm_home: Path, tmp_path: Path
) -> None:
    # timeout_seconds 8 + a margin of 172 s: Slurm's limit is 3 minutes (600 s by default).
    write_providers(slurm_home, slurm_cluster, tmp_path, provider={"time_margin_seconds": 172})
    script = "import time; print('started', flush=True); time.sleep(300)"
    job_id = submit_detached("python3", "-c", script, timeout=8)
    (allocation,) = wait_until(slurm_cluster.queue, timeout=60, what="the allocation")
    shown = slurm_cluster.command("scontrol", "-o", "show", "job", allocation.split()[0])
    assert " TimeLimit=00:03:00 " in shown, shown
    wait_until(lambda: status(job_id)["state"] == "failed", timeout=180, what="the job to end")
    ended = status(job_id)
    assert ended["reason"] == "timeout", ended
    assert "started" in run_cli(["logs", job_id]).stdout  # it ran, then was stopped
    wait_until(lambda: ledger(job_id)["instances"][0]["state"] == "terminated", what="teardown")
    # Ended by gpulayer's scancel, well before Slurm's own limit.
    wait_until(lambda: slurm_cluster.queue() == [], timeout=30, what="an empty queue")
    wait_until(lambda: no_job_keys(slurm_cluster), timeout=30, what="the job's key to go")
    wait_until(lambda: no_worker_installs(slurm_cluster, tmp_path), timeout=30, what="the worker")


def test_a_partition_without_capacity_falls_back_to_the_next_target(
    slurm_cluster: SlurmCluster, slurm_home: Path, tmp_path: Path
) -> None:
    """The job prefers Slurm (target cloud, provider slurm) and, with no other cloud offer
    left, falls back to its next target, this machine (``fallback_targets: [local]``). A rented
    machine as the next offer within the cloud target: the journey after this one."""
    write_providers(slurm_home, slurm_cluster, tmp_path)
    # Someone else's job holds every node of the one partition a cpu job fits.
    holder = slurm_cluster.hold_nodes("cpu", 2)
    try:
        spec = {
            "workload": {
                "kind": "command",
                "command": ["python3", "-c", "import os; print('ran on', os.uname().nodename)"],
            },
            "placement": {
                "target": "cloud",
                "fallback_targets": ["local"],
                "providers": ["slurm"],
                "max_hourly_cost": 1,  # the cpu partition only
                "on_unschedulable": "fail",
                "provisioning": {"provisioning_timeout_seconds": 5},
            },
        }
        (tmp_path / "job.json").write_text(json.dumps(spec))
        result = run_cli(["submit", "-f", str(tmp_path / "job.json")], timeout=180)
        job = last_job()
        assert result.returncode == 0, f"{why_it_failed(result.stderr)}\n{job}"
        assert (job["state"], job["target"]) == ("succeeded", "local")
        assert f"ran on {os.uname().nodename}" in result.stdout
        # Why Slurm was skipped, in Slurm's words, then where the job went: in its log and
        # its status.
        said = run_cli(["logs", job["id"]]).stderr
        assert "waiting for capacity: slurm job" in said and "is pending (Resources)" in said
        skipped = next(line for line in said.splitlines() if "trying target local" in line)
        assert "still pending after 5 s (Resources)" in skipped, said
        assert job["message"].startswith("cloud: no capacity: "), job["message"]
        assert job["message"].endswith("still pending after 5 s (Resources)); trying target local")
        # The allocation it waited in was cancelled; the other job's is untouched.
        wait_until(
            lambda: [line.split()[0] for line in slurm_cluster.queue()] == [holder],
            timeout=30,
            what="the job's allocation to leave the queue",
        )
        (tried,) = ledger(job["id"])["instances"]
        # Never ran, so nothing is charged for it.
        assert (tried["provider"], tried["zone"], tried["state"]) == (
            "slurm",
            "cpu",
            "never_launched",
        )
        assert tried["cost"] == 0
    finally:
        slurm_cluster.command("scancel", holder)
    wait_until(lambda: slurm_cluster.queue() == [], timeout=30, what="an empty queue")
    wait_until(lambda: no_job_keys(slurm_cluster), timeout=30, what="the job's key to go")


def test_a_busy_partition_gives_way_to_a_rented_machine(
    slurm_cluster: SlurmCluster, slurm_home: Path, tmp_path: Path, ssh_hosts: HostFactory
) -> None:
    """Slurm's partition is the cheaper offer, but someone else's job holds its nodes: once the
    allocation has pended its ``pending_timeout_seconds``, the next offer, a rented machine of
    the ssh provider (a host of its own, sharing nothing with this machine), runs the job."""
    (rented,) = ssh_hosts(1, names=["rented"])
    rented_installs = tmp_path / "rented-installs"  # a path on the rented host
    ssh_section = {
        "hosts": [host_entry(rented, "rented-box", 0.9, rented_installs)],
        "state_dir": str(tmp_path / "ssh-provider-state"),
    }
    write_providers(
        slurm_home,
        slurm_cluster,
        tmp_path,
        provider={"pending_timeout_seconds": 5},
        others={"ssh": ssh_section},
    )
    holder = slurm_cluster.hold_nodes("cpu", 2)
    try:
        spec = {
            "workload": {
                "kind": "command",
                "command": ["python3", "-c", "import os; print('ran in', os.getcwd())"],
            },
            "placement": {
                "target": "cloud",
                "providers": ["slurm", "ssh"],
                "max_hourly_cost": 1,  # the cpu partition (0.6) and the rented box (0.9)
                "provisioning": {"provisioning_timeout_seconds": 240},
            },
        }
        (tmp_path / "job.json").write_text(json.dumps(spec))
        result = run_cli(["submit", "-f", str(tmp_path / "job.json")], timeout=300)
        job = last_job()
        assert result.returncode == 0, f"{why_it_failed(result.stderr)}\n{job}"
        assert (job["state"], job["target"]) == ("succeeded", "cloud")
        assert f"ran in {rented_installs}" in result.stdout, result.stdout
        tried, rented_try = ledger(job["id"])["instances"]
        # The cheaper partition first, never run and never charged; then the rented box.
        assert (tried["provider"], tried["zone"], tried["state"]) == (
            "slurm",
            "cpu",
            "never_launched",
        )
        assert tried["cost"] == 0
        assert (rented_try["provider"], rented_try["instance_type"]) == ("ssh", "rented-box")
        said = run_cli(["logs", job["id"]]).stderr
        assert "still pending after 5 s (Resources)" in said, said
        wait_until(
            lambda: ledger(job["id"])["instances"][1]["state"] == "terminated",
            what="the rented machine's teardown",
        )
        wait_until(lambda: not job_processes(rented_installs, rented), what="the worker to go")
        # The other job's allocation is untouched; the job's own left the queue.
        assert [line.split()[0] for line in slurm_cluster.queue()] == [holder]
    finally:
        slurm_cluster.command("scancel", holder)
    wait_until(lambda: slurm_cluster.queue() == [], timeout=30, what="an empty queue")
    wait_until(lambda: no_job_keys(slurm_cluster), timeout=30, what="the job's key to go")


def test_more_jobs_than_launch_threads_on_a_busy_partition_all_run(
    slurm_cluster: SlurmCluster, slurm_home: Path, tmp_path: Path
) -> None:
    # The controller launches 2 at a time here (parallel_launches). 2 allocations wait in
    # Slurm's queue, each inside its launch, a third launch waits for a thread well past the
    # 5 s a record may stay `requested`, and when a node frees, the allocation that gets it
    # must still have its worker started while the others wait on. The control plane of the
    # module's earlier tests goes first: it would launch with its own settings.
    stop_local_control_plane(slurm_home)
    write_providers(
        slurm_home,
        slurm_cluster,
        tmp_path,
        controller={"state_timeouts": {"requested": 5}, "parallel_launches": 2},
    )
    holders = {
        node: slurm_cluster.sbatch(
            "-p", "cpu", "-w", node, "--exclusive", "-J", "someone-else", "--wrap", "sleep 300"
        )
        for node in ("cpu1", "cpu2")
    }
    try:
        wait_until(
            lambda: sum(1 for line in slurm_cluster.queue() if "someone-else RUNNING" in line) == 2,
            timeout=30,
            what="the other jobs to run",
        )
        jobs = [submit_detached("python3", "-c", "print('done')") for _ in range(3)]
        wait_until(
            lambda: sum(1 for line in slurm_cluster.queue() if " gpulayer-" in line) == 2,
            timeout=60,
            what="2 allocations pending",
        )
        slurm_cluster.command("scancel", holders["cpu1"])
        wait_until(
            lambda: any(status(job_id)["state"] == "succeeded" for job_id in jobs),
            timeout=120,
            what="a job to run on the node that freed",
        )
    finally:
        slurm_cluster.command("scancel", *holders.values())
    for job_id in jobs:
        wait_until(
            lambda job_id=job_id: status(job_id)["state"] in ("succeeded", "failed"),
            timeout=180,
            what=f"job {job_id} to end",
        )
    ended = {job_id: status(job_id) for job_id in jobs}
    assert {j["state"] for j in ended.values()} == {"succeeded"}, ended
    # Each ran in the one allocation it launched: none was given up as stuck and retried.
    for job_id in jobs:
        wait_until(
            lambda job_id=job_id: (
                [i["state"] for i in ledger(job_id)["instances"]] == ["terminated"]
            ),
            timeout=60,
            what=f"job {job_id}'s one allocation to end",
        )
    wait_until(lambda: slurm_cluster.queue() == [], timeout=30, what="an empty queue")
    wait_until(lambda: no_job_keys(slurm_cluster), timeout=30, what="the jobs' keys to go")
