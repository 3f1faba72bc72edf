"""Cloud gangs on ssh-provider hosts (real sshd hosts in network namespaces): N hosts claimed
together, a 2-node gloo job across them, torn down together; a gang that cannot be had whole
is rolled back; one that no offer could ever take is refused at submit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.e2e_cloud.journey import last_job, ledger, wait_until
from tests.e2e_cloud.test_cloud_ssh_journey import host_entry, job_processes, write_providers
from tests.support.cli import run_cli
from tests.support.servers import free_port

DDP_TRAIN = Path(__file__).parents[1] / "fixtures" / "ddp" / "train.py"


def gang_job(
    folder: Path,
    *,
    max_hourly_cost: float | None = None,
    provider: str = "ssh",
    args: tuple[str, ...] = ("5",),
) -> Path:
    """A 2-node x 1-process gloo job file, with the DDP fixture beside it as its source."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(DDP_TRAIN, folder / "train.py")
    placement: dict[str, Any] = {
        "target": "cloud",
        "providers": [provider],
        "on_unschedulable": "fail",
    }
    if max_hourly_cost is not None:
        placement["max_hourly_cost"] = max_hourly_cost
    spec = {
        "name": "cloud-gang",
        "workload": {
            "kind": "distributed",
            "entrypoint": "train.py",
            "args": list(args),
            "num_workers": 2,
            "procs_per_worker": 1,
            "comm_backend": "gloo",
            "rendezvous": {"port": free_port(), "join_timeout_seconds": 60},
        },
        "resources": {"cpu_cores": 1},
        "placement": placement,
    }
    path = folder / "job.json"
    path.write_text(json.dumps(spec))
    return path


def rank_reports(text: str) -> list[dict[str, Any]]:
    return [
        json.loads(line.split("RANKINFO ", 1)[1])
        for line in text.splitlines()
        if "RANKINFO " in line
    ]


def free_hosts() -> list[str]:
    offers = json.loads(run_cli(["offers", "--provider", "ssh", "--json"]).stdout)
    return sorted(o["instance_type"] for o in offers if o["enabled"])


def teardown_done(job_id: str) -> list[dict[str, Any]]:
    wait_until(
        lambda: all(
            i["state"] in ("terminated", "never_launched") for i in ledger(job_id)["instances"]
        ),
        what="the gang's teardown",
    )
    return list(ledger(job_id)["instances"])


def two_hosts(
    ssh_hosts: Any, home: Path, tmp_path: Path, names: tuple[str, str]
) -> tuple[Path, list[Any]]:
    """Two alike 0.4 USD/h hosts in providers.yaml: (their install root, the hosts)."""
    first, second = ssh_hosts(2)
    root = tmp_path / "installs"
    write_providers(
        home,
        [host_entry(first, names[0], 0.4, root), host_entry(second, names[1], 0.4, root)],
        system_site_packages=True,  # torch comes from this machine's python
    )
    return root, [first, second]


@pytest.mark.slow
def test_a_gang_runs_on_two_hosts_claimed_together_and_is_torn_down_together(
    ssh_hosts: Any, cloud_home: Path, tmp_path: Path
) -> None:
    root, (first, second) = two_hosts(ssh_hosts, cloud_home, tmp_path, ("g1", "g2"))
    # max_hourly_cost is per node: 0.5 admits each 0.4 host, though the gang costs 0.8.
    job_file = gang_job(tmp_path / "src", max_hourly_cost=0.5)
    result = run_cli(["submit", "-f", str(job_file)], cwd=job_file.parent, timeout=400)
    job = last_job()
    assert result.returncode == 0, (result.stderr[-3000:], job)
    assert job["state"] == "succeeded"

    reports = rank_reports(result.stdout + result.stderr)
    assert sorted(r["rank"] for r in reports) == [0, 1]
    assert {r["world"] for r in reports} == {2}
    assert {r["env"]["GPULAYER_NODE_RANK"] for r in reports} == {"0", "1"}
    assert {r["env"]["MASTER_ADDR"] for r in reports} <= {first.address, second.address}
    attempts = job["attempts"]
    assert sorted(a["node_rank"] for a in attempts) == [0, 1]
    assert len({a["worker_id"] for a in attempts}) == 2
    assert "gang of 2 launched together" in result.stderr

    instances = teardown_done(job["id"])
    assert len(instances) == 2
    assert {i["instance_id"] for i in instances} == {"g1", "g2"}
    assert sorted(i["node_rank"] for i in instances) == [0, 1]
    assert len({i["launch_id"] for i in instances}) == 1 and instances[0]["launch_id"]
    assert {i["state"] for i in instances} == {"terminated"}
    costs = ledger(job["id"])
    # The job's cost is the gang's: every node's hours at its own price.
    assert costs["total"]["USD"] == pytest.approx(sum(i["cost"] for i in instances))
    assert all(i["hourly_price"] == 0.4 for i in instances)
    ended = [i["ended_at"] for i in instances]
    assert ended[0] == ended[1]  # one terminate call for both nodes

    assert free_hosts() == ["g1", "g2"]  # both claims are freed
    assert job_processes(root) == []
    assert not list(root.glob(f"{job['id']}*"))  # every node's install dir is gone
    assert not list((cloud_home / "keys").glob("r-*"))


def test_a_gang_that_cannot_be_had_whole_claims_nothing(
    ssh_hosts: Any, cloud_home: Path, tmp_path: Path
) -> None:
    (only,) = ssh_hosts(1)
    write_providers(cloud_home, [host_entry(only, "lone", 0.4, tmp_path / "installs")])
    job_file = gang_job(tmp_path / "src")
    result = run_cli(["submit", "-f", str(job_file)], cwd=job_file.parent, timeout=120)
    assert result.returncode == 1
    job = last_job()
    assert job["state"] == "failed" and job["reason"] == "unschedulable"
    assert "a gang of 2 needs 2 free hosts like lone" in result.stderr
    instances = ledger(job["id"])["instances"]
    # Both nodes were written down, neither was created: the one host was never claimed.
    assert sorted(i["node_rank"] for i in instances) == [0, 1], result.stderr
    assert {i["state"] for i in instances} == {"never_launched"}
    assert free_hosts() == ["lone"]


def running_gang(
    ssh_hosts: Any, home: Path, tmp_path: Path, names: tuple[str, str], epochs: str
) -> tuple[Path, str]:
    """Two hosts and a slow gang running on both (0.5 s an epoch): (install root, job id)."""
    root, _ = two_hosts(ssh_hosts, home, tmp_path, names)
    job_file = gang_job(tmp_path / "src", args=(epochs, "slow"))
    result = run_cli(["submit", "-d", "-f", str(job_file)], cwd=job_file.parent, timeout=120)
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip().split()[-1]

    def both_run() -> bool:
        states = [i["state"] for i in ledger(job_id)["instances"]]
        if any(state in ("draining", "terminating", "terminated") for state in states):
            logs = run_cli(["logs", job_id]).stdout
            raise AssertionError(f"the gang ended before it ran: {states}\n{logs}")
        return states == ["in_use", "in_use"]

    wait_until(both_run, timeout=240, what="both nodes to run")
    assert job_processes(root)
    return root, job_id


@pytest.mark.slow
def test_a_cancelled_gang_is_torn_down_together_with_every_process(
    ssh_hosts: Any, cloud_home: Path, tmp_path: Path
) -> None:
    root, job_id = running_gang(ssh_hosts, cloud_home, tmp_path, ("c1", "c2"), "600")
    assert run_cli(["cancel", job_id]).returncode == 0
    instances = teardown_done(job_id)
    assert {i["state"] for i in instances} == {"terminated"}
    wait_until(lambda: not job_processes(root), what="every node's processes to end")
    assert free_hosts() == ["c1", "c2"]
    assert not list(root.glob(f"{job_id}*"))


@pytest.mark.slow
def test_a_gang_outlives_its_controller_and_is_torn_down_together_after(
    ssh_hosts: Any, cloud_home: Path, tmp_path: Path
) -> None:
    from tests.e2e_cloud.test_cloud_ssh_lifecycle import kill_controller, logs

    root, job_id = running_gang(ssh_hosts, cloud_home, tmp_path, ("k1", "k2"), "60")
    before = sorted(i["request_id"] for i in ledger(job_id)["instances"])
    kill_controller(cloud_home)
    # The next command starts a new control plane, which reopens both nodes' tunnels.
    wait_until(
        lambda: logs(job_id).count("SSH tunnel reopened") >= 2,
        timeout=120,
        what="both tunnels",
    )
    wait_until(lambda: last_job()["state"] in ("succeeded", "failed"), timeout=240, what="the gang")
    job = last_job()
    assert job["state"] == "succeeded", job
    instances = teardown_done(job_id)
    assert sorted(i["request_id"] for i in instances) == before  # rented once, not again
    assert {i["state"] for i in instances} == {"terminated"}
    wait_until(lambda: not job_processes(root), what="every node's processes to end")
    assert free_hosts() == ["k1", "k2"]


@pytest.mark.slow
def test_a_node_that_fails_to_bootstrap_takes_its_gang_down_and_blocks_its_zone(
    ssh_hosts: Any, cloud_home: Path, tmp_path: Path
) -> None:
    first, second = ssh_hosts(2)
    root = tmp_path / "installs"
    write_providers(
        cloud_home,
        [
            host_entry(first, "ok", 0.4, root),
            host_entry(second, "broken", 0.4, root, python="/nonexistent/python3"),
        ],
    )
    job_file = gang_job(tmp_path / "src")
    result = run_cli(["submit", "-f", str(job_file)], cwd=job_file.parent, timeout=400)
    assert result.returncode == 1
    job = last_job()
    assert job["state"] == "failed"
    assert "tearing the whole gang down and blocking zone" in result.stderr
    instances = teardown_done(job["id"])
    launches = {i["launch_id"] for i in instances}
    # Each try was a whole gang (2 nodes under one launch), each ended whole.
    assert all(sum(i["launch_id"] == launch for i in instances) == 2 for launch in launches)
    assert {i["state"] for i in instances} <= {"terminated", "never_launched"}
    assert "partial gang launch" in job["message"] or "every offer failed" in job["message"]
    assert free_hosts() == ["broken", "ok"]
    assert job_processes(root) == []
    assert not list((cloud_home / "keys").glob("r-*"))


def test_a_gang_no_offer_could_ever_take_is_refused_at_submit(
    ssh_hosts: Any, cloud_home: Path, tmp_path: Path
) -> None:
    first, second = ssh_hosts(2)
    write_providers(
        cloud_home,
        [
            host_entry(first, "p1", 0.4, tmp_path / "a"),
            host_entry(second, "p2", 0.4, tmp_path / "b"),
        ],
    )
    job_file = gang_job(tmp_path / "src", max_hourly_cost=0.3)
    result = run_cli(["submit", "-f", str(job_file)], cwd=job_file.parent, timeout=120)
    assert result.returncode == 1
    assert "max_hourly_cost 0.3 USD is below every offer" in result.stderr
    assert "priced per node" in result.stderr
    job = last_job()
    assert job["state"] == "failed" and job["reason"] == "unschedulable"
    # Refused before the job was kept as queued: not one instance was written down.
    assert ledger(job["id"])["instances"] == []
    assert "unschedulable" in json.dumps(job)
