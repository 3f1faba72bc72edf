"""The cloud lifecycle on moto: an instance ended from outside is a preemption (the attempt
ends as `preempted`, retried elsewhere when the job says so), and a controller killed with -9
mid-job resumes it. Instances boot as namespace sshd hosts (see test_aws_journey)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

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
    status,
)
from tests.support.cli import run_cli
from tests.support.moto_lab import CloudInit

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
    assert "reclaimed by the provider" in (job["message"] or "")
    (attempt,) = job["attempts"]
    assert (attempt["state"], attempt["reason"]) == ("failed", "preempted")
    (instance,) = wait_for_teardown(job_id, cloud_init)
    assert instance["state"] == "terminated"
    assert held_in_moto(aws_lab.ec2()) == {"instances": [], "key_pairs": [], "security_groups": []}
    assert not list((cloud_home / "keys").glob("r-*"))


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
    gate.touch()
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
    gate.touch()
    wait_until(lambda: status(job_id)["state"] == "succeeded", timeout=120, what="the job")
    (instance,) = wait_for_teardown(job_id, cloud_init)
    assert instance["instance_id"] == before["instance_id"]  # nothing rented twice
    assert len(aws_lab.moto.calls("RunInstances")) == 1
    assert held_in_moto(aws_lab.ec2()) == {"instances": [], "key_pairs": [], "security_groups": []}
    assert json.loads(run_cli(["instances", "--json"]).stdout) == []
    assert ledger(job_id)["instances"][0]["state"] == "terminated"
