"""The cloud lifecycle on moto: an instance ended from outside is a preemption (the attempt
ends as `preempted`, retried elsewhere when the job says so), and a controller killed with -9
mid-job resumes it. Instances boot as sshd hosts of the lab, machines of their own (see
test_aws_journey): a job's gate is made on the instances up at the time."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpulayer.cloud.lifecycle.planning import backoff_seconds
from tests.e2e_cloud.journey import ledger, wait_until
from tests.e2e_cloud.test_aws_journey import (
    AwsLab,
    aws_environment,
    aws_lab,
    cloud_init,
    held_in_moto,
    moto,
    offer_cache,
    wait_for_teardown,
    write_providers,
)
from tests.e2e_cloud.test_cloud_ssh_lifecycle import (
    gated_script,
    instances,
    kill_controller,
    logs,
    open_gate,
    status,
)
from tests.support.cli import run_cli
from tests.support.moto_lab import CloudInit
from tests.support.package_index import PackageIndex

__all__ = ["aws_environment", "aws_lab", "cloud_init", "moto", "offer_cache"]

pytestmark = pytest.mark.slow


def submit_job_file(folder: Path, gate: Path, marker: str, **spec: Any) -> str:
    data = {
        "workload": {"kind": "command", "command": ["python", "-c", gated_script(gate, marker)]},
        "placement": {"target": "cloud", "providers": ["aws"]},
        **spec,
    }
    path = folder / f"{marker}.yaml"
    path.write_text(yaml.safe_dump(data))
    result = run_cli(["submit", "-d", "-f", str(path)])
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def running_instance(job_id: str) -> dict[str, Any]:
    wait_until(lambda: status(job_id)["state"] == "running", timeout=240, what="the job to run")
    (live,) = [i for i in instances("--job", job_id) if i["state"] == "in_use"]
    return live


def test_an_instance_ended_from_outside_ends_the_attempt_as_preempted(
    aws_lab: AwsLab, cloud_init: CloudInit, cloud_home: Path, tmp_path: Path
) -> None:
    write_providers(cloud_home, aws_lab, tmp_path)
    job_id = submit_job_file(tmp_path, tmp_path / "gate", "reclaimed")
    live = running_instance(job_id)
    aws_lab.ec2().terminate_instances(InstanceIds=[live["instance_id"]])  # as a spot reclaim

    wait_until(lambda: status(job_id)["state"] == "failed", timeout=120, what="the job to end")
    job = status(job_id)
    assert job["reason"] == "preempted"
    # The machine's shutdown reached its worker first: the worker said why the job ended.
    assert job["message"] == "the machine is shutting down"
    (attempt,) = job["attempts"]
    assert (attempt["state"], attempt["reason"]) == ("failed", "preempted")
    (instance,) = wait_for_teardown(job_id, cloud_init)
    assert instance["state"] == "terminated"
    assert held_in_moto(aws_lab.ec2()) == {"instances": [], "key_pairs": [], "security_groups": []}
    assert not list((cloud_home / "keys").glob("r-*"))
    (ended,) = instances("--job", job_id)
    assert ended["outcome"] == "reclaimed" and ended["offer_held_until"] is not None, json.dumps(
        ended
    )

    # The hold is in the store: a controller killed with -9 and started again keeps it, and
    # the next job is not sent to the offer just reclaimed.
    kill_controller(cloud_home)
    second = submit_job_file(tmp_path, tmp_path / "gate2", "after-restart")
    held = f"reclaimed from job {job_id}"

    def placed_or_held() -> bool:
        return bool(instances("--job", second)) or held in (status(second)["message"] or "")

    wait_until(placed_or_held, timeout=120, what="the second job to be placed or to wait")
    for other in instances("--job", second):
        assert (other["zone"], other["instance_type"], other["spot"]) != (
            ended["zone"],
            ended["instance_type"],
            ended["spot"],
        ), other
    if instances("--job", second):
        # Another offer took it: let its machine finish booting before the cancel ends it.
        wait_until(lambda: status(second)["state"] == "running", timeout=240, what="the second job")
    assert run_cli(["cancel", second]).returncode == 0
    wait_until(
        lambda: all(
            i["state"] in ("terminated", "never_launched") for i in instances("--job", second)
        ),
        timeout=120,
        what="the second job's instances to go",
    )


SAVES_ON_SIGTERM = """
import os, pathlib, signal, sys, time
from gpulayer.sdk import train

os.environ["RANK"] = "0"  # a one-process run, as a Trainer's rank 0

out = pathlib.Path(os.environ["GPULAYER_OUTPUT_DIR"]) / "checkpoint"
step = 0


def save(*_):
    out.mkdir(parents=True, exist_ok=True)
    (out / "state.txt").write_text(f"step {step}")
    print(f"saved at step {step}", flush=True)
    sys.exit(0)


signal.signal(signal.SIGTERM, save)
while True:
    step += 1
    train.report({"step": step})
    time.sleep(0.2)
"""


def test_a_reclaimed_machine_gives_its_job_the_grace_to_save_and_keeps_what_it_wrote(
    aws_lab: AwsLab, cloud_init: CloudInit, cloud_home: Path, tmp_path: Path
) -> None:
    """A spot reclaim shuts the machine down under a running job: the job gets SIGTERM and its
    grace, what it then wrote comes back as the job's outputs, the reports it made show in
    status, and the attempt ends as preempted."""
    write_providers(cloud_home, aws_lab, tmp_path)
    data = {
        "workload": {"kind": "command", "command": ["python", "-c", SAVES_ON_SIGTERM]},
        "placement": {"target": "cloud", "providers": ["aws"]},
        "grace_seconds": 20,
    }
    path = tmp_path / "saves.yaml"
    path.write_text(yaml.safe_dump(data))
    submitted = run_cli(["submit", "-d", "-f", str(path)])
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    live = running_instance(job_id)
    wait_until(
        lambda: logs(job_id).count("gpulayer.train.report") >= 3, timeout=60, what="3 reports"
    )
    aws_lab.ec2().terminate_instances(InstanceIds=[live["instance_id"]])  # as a spot reclaim

    wait_until(lambda: status(job_id)["state"] == "failed", timeout=150, what="the job to end")
    job = status(job_id)
    assert (job["reason"], job["message"]) == ("preempted", "the machine is shutting down")
    (attempt,) = job["attempts"]
    assert (attempt["state"], attempt["reason"]) == ("failed", "preempted")
    steps = [report["step"] for report in job["result"]["metrics"]]
    assert len(steps) >= 3 and steps == list(range(1, len(steps) + 1)), steps
    out = tmp_path / "out"
    assert run_cli(["artifacts", job_id, "--download", str(out)]).returncode == 0
    saved = (out / "checkpoint" / "state.txt").read_text()
    assert saved.startswith("step ") and int(saved.split()[1]) >= steps[-1]
    assert f"saved at {saved}" in logs(job_id)
    (instance,) = wait_for_teardown(job_id, cloud_init)
    assert instance["state"] == "terminated"
    assert held_in_moto(aws_lab.ec2()) == {"instances": [], "key_pairs": [], "security_groups": []}


def test_a_preempted_job_that_retries_runs_again_on_the_next_offer(
    aws_lab: AwsLab, cloud_init: CloudInit, cloud_home: Path, tmp_path: Path
) -> None:
    write_providers(cloud_home, aws_lab, tmp_path)
    gate = tmp_path / "gate"
    job_id = submit_job_file(
        tmp_path, gate, "retried", retry={"max_attempts": 2, "retry_on": ["preempted"]}
    )
    first = running_instance(job_id)
    aws_lab.ec2().terminate_instances(InstanceIds=[first["instance_id"]])

    wait_until(
        lambda: len(status(job_id)["attempts"]) == 2 and status(job_id)["state"] == "running",
        timeout=240,
        what="the second attempt",
    )
    open_gate(gate, *cloud_init.hosts().values())
    wait_until(lambda: status(job_id)["state"] == "succeeded", timeout=120, what="the job")
    job = status(job_id)
    assert (job["attempts"][0]["state"], job["attempts"][0]["reason"]) == ("failed", "preempted")
    assert job["attempts"][1]["state"] == "succeeded"
    assert "retrying" in logs(job_id)
    rows = wait_for_teardown(job_id, cloud_init)
    assert [i["state"] for i in rows] == ["terminated", "terminated"]
    # The reclaimed offer is held back for a while: the retry went to another one.
    assert rows[0]["request_id"] == first["request_id"]
    assert (rows[1]["zone"], rows[1]["instance_type"]) != (first["zone"], first["instance_type"])
    assert held_in_moto(aws_lab.ec2()) == {"instances": [], "key_pairs": [], "security_groups": []}


def test_controller_killed_mid_job_on_moto_resumes_it(
    aws_lab: AwsLab, cloud_init: CloudInit, cloud_home: Path, tmp_path: Path
) -> None:
    write_providers(cloud_home, aws_lab, tmp_path)
    gate = tmp_path / "gate"
    job_id = submit_job_file(tmp_path, gate, "resumed-on-moto")
    before = running_instance(job_id)
    kill_controller(cloud_home)

    wait_until(lambda: "SSH tunnel reopened" in logs(job_id), timeout=90, what="the tunnel")
    (host,) = cloud_init.hosts().values()
    open_gate(gate, host)
    wait_until(lambda: status(job_id)["state"] == "succeeded", timeout=120, what="the job")
    (instance,) = wait_for_teardown(job_id, cloud_init)
    assert instance["instance_id"] == before["instance_id"]  # nothing rented twice
    assert len(aws_lab.moto.calls("RunInstances")) == 1
    assert held_in_moto(aws_lab.ec2()) == {"instances": [], "key_pairs": [], "security_groups": []}
    assert json.loads(run_cli(["instances", "--json"]).stdout) == []
    assert ledger(job_id)["instances"][0]["state"] == "terminated"


def test_a_reclaim_of_one_gang_node_ends_the_whole_gang_as_preempted(
    aws_lab: AwsLab,
    cloud_init: CloudInit,
    cloud_home: Path,
    tmp_path: Path,
    torch_index: PackageIndex,
) -> None:
    """A spot reclaim of node 1 alone: the gang's attempt ends as preempted on every node and
    both machines go. (A distributed job takes no retry, by the JobSpec; the reclaimed offer is
    held for the next job.)"""
    from tests.e2e_cloud.test_cloud_ssh_gang import gang_in_torchrun

    write_providers(cloud_home, aws_lab, tmp_path)
    job_id, first = gang_in_torchrun(tmp_path / "src", "aws", torch_index)
    aws_lab.ec2().terminate_instances(InstanceIds=[first[1]["instance_id"]])  # node 1 only

    wait_until(lambda: status(job_id)["state"] == "failed", timeout=240, what="the gang to end")
    job = status(job_id)
    assert job["reason"] == "preempted", job
    attempts = job["attempts"]
    assert sorted(a["node_rank"] for a in attempts) == [0, 1]
    assert {a["state"] for a in attempts} == {"failed"}  # node 0 did not run on alone

    rows = wait_for_teardown(job_id, cloud_init)
    assert len(rows) == 2 and {i["state"] for i in rows} == {"terminated"}
    by_id = {i["instance_id"]: i for i in instances("--job", job_id)}
    reclaimed = by_id[first[1]["instance_id"]]
    assert reclaimed["outcome"] == "reclaimed" and reclaimed["offer_held_until"], reclaimed
    assert held_in_moto(aws_lab.ec2()) == {"instances": [], "key_pairs": [], "security_groups": []}
    assert not list((cloud_home / "keys").glob("r-*"))


def _at(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _tries(job_id: str) -> list[dict[str, Any]]:
    return sorted(instances("--job", job_id), key=lambda i: _at(i["history"][0]["at"]))


def test_a_capacity_backoff_holds_across_a_kill_9_of_the_controller(
    aws_lab: AwsLab, cloud_init: CloudInit, cloud_home: Path, tmp_path: Path
) -> None:
    """Both zones refuse for capacity, then one more try does; the controller is killed right
    after that refusal and comes back well inside the backoff it set. The next try waits for
    the backoff the store's records give, not a fresh one: its place stays blocked."""
    write_providers(cloud_home, aws_lab, tmp_path)
    aws_lab.moto.fault(
        "RunInstances",
        "InsufficientInstanceCapacity",
        message="We currently do not have sufficient capacity in the Availability Zone",
        times=3,
    )
    gate = tmp_path / "gate"
    job_id = submit_job_file(tmp_path, gate, "backoff")
    wait_until(
        lambda: len([t for t in _tries(job_id) if t["state"] == "never_launched"]) == 3,
        timeout=120,
        what="three capacity refusals",
    )
    killed_at = time.time()
    kill_controller(cloud_home)
    assert run_cli(["status", job_id]).returncode == 0  # the next command starts it again
    restarted_at = time.time()

    wait_until(lambda: status(job_id)["state"] == "running", timeout=240, what="the job to run")
    tries = _tries(job_id)
    refused, ran = tries[:3], tries[3]
    assert [t["outcome"] for t in refused] == ["capacity"] * 3, refused
    third_refusal = _at(refused[2]["ended_at"])
    backoff = backoff_seconds(3)
    # The restart came inside the backoff, so the wait after it is the restarted one's.
    assert third_refusal <= killed_at and restarted_at < third_refusal + backoff
    assert _at(ran["history"][0]["at"]) >= third_refusal + backoff - 0.5, (ran, third_refusal)
    assert len(aws_lab.moto.calls("RunInstances")) == 4

    open_gate(gate, *cloud_init.hosts().values())
    wait_until(lambda: status(job_id)["state"] == "succeeded", timeout=120, what="the job")
    wait_for_teardown(job_id, cloud_init)
    assert held_in_moto(aws_lab.ec2()) == {"instances": [], "key_pairs": [], "security_groups": []}


def test_a_reclaimed_offer_stays_held_across_a_kill_9_of_the_controller(
    aws_lab: AwsLab, cloud_init: CloudInit, cloud_home: Path, tmp_path: Path
) -> None:
    """The cheapest offer's machine is reclaimed under its job; after the controller is killed
    and started again, a new job of the same shape does not get that offer while it is held."""
    write_providers(cloud_home, aws_lab, tmp_path, hold_reclaimed_seconds=600)
    gate = tmp_path / "gate"
    first_job = submit_job_file(tmp_path, gate, "reclaimed")
    first = running_instance(first_job)
    aws_lab.ec2().terminate_instances(InstanceIds=[first["instance_id"]])
    wait_until(lambda: status(first_job)["state"] == "failed", timeout=120, what="the reclaim")
    wait_for_teardown(first_job, cloud_init)
    (reclaimed,) = instances("--job", first_job)
    assert reclaimed["outcome"] == "reclaimed" and reclaimed["offer_held_until"], reclaimed

    kill_controller(cloud_home)
    second_job = submit_job_file(tmp_path, gate, "after-restart")
    second = running_instance(second_job)
    held = (reclaimed["zone"], reclaimed["instance_type"])
    assert (second["zone"], second["instance_type"]) != held, (second, held)

    open_gate(gate, *cloud_init.hosts().values())
    wait_until(lambda: status(second_job)["state"] == "succeeded", timeout=120, what="the job")
    wait_for_teardown(second_job, cloud_init)
    assert held_in_moto(aws_lab.ec2()) == {"instances": [], "key_pairs": [], "security_groups": []}
