"""A warm EC2 instance on moto (an instance that boots as a lab sshd host): with the
``gpulayer:`` section's idle_seconds, the instance outlives its job, idle, its worker running;
the next job that fits takes it with no launch and no bootstrap, and `gpulayer reap` ends it,
leaving nothing in moto."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e_cloud.journey import wait_until
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
from tests.e2e_cloud.test_cloud_ssh_lifecycle import instances, status
from tests.e2e_cloud.test_cloud_ssh_warm import idle_instance, worker_of
from tests.support.cli import run_cli
from tests.support.moto_lab import CloudInit

__all__ = ["aws_environment", "aws_lab", "cloud_init", "moto", "offer_cache"]

pytestmark = pytest.mark.slow


def run_on_aws(marker: str) -> tuple[str, str]:
    result = run_cli(
        [
            "submit",
            "--target",
            "cloud",
            "--provider",
            "aws",
            "--",
            "python",
            "-c",
            f"print('ran {marker}')",
        ],
        timeout=400,
    )
    assert result.returncode == 0, result.stderr
    assert f"ran {marker}" in result.stdout
    listed = run_cli(["ls", "--json", "-n", "1"])
    return str(json.loads(listed.stdout)[0]["id"]), result.stderr


def test_the_next_job_takes_the_idle_instance_and_a_reap_ends_it(
    aws_lab: AwsLab, cloud_init: CloudInit, cloud_home: Path, tmp_path: Path
) -> None:
    write_providers(cloud_home, aws_lab, tmp_path, idle_seconds=600)
    first, first_log = run_on_aws("first")
    assert "bootstrapping the worker" in first_log
    idle = wait_until(idle_instance, what="the instance to go idle")
    assert idle["job_id"] == first and idle["state_label"].startswith("idle (")
    assert len(held_in_moto(aws_lab.ec2())["instances"]) == 1

    second, second_log = run_on_aws("second")
    assert "bootstrapping the worker" not in second_log
    assert "no launch and no bootstrap" in second_log
    assert worker_of(second) == worker_of(first)
    (instance,) = status(second)["instances"]
    assert instance["instance_id"] == idle["instance_id"]  # one EC2 instance, launched once
    moves = [(h["from"], h["to"]) for h in instance["history"]]
    assert moves.count(("requested", "launching")) == 1
    assert ("idle", "ready") in moves and moves.index(("in_use", "idle")) < moves.index(
        ("idle", "ready")
    )
    assert len(held_in_moto(aws_lab.ec2())["instances"]) == 1

    wait_until(idle_instance, what="the instance to go idle again")
    reaped = run_cli(["reap"], timeout=120)
    assert reaped.returncode == 0, reaped.stderr
    (ended,) = wait_for_teardown(second, cloud_init)
    assert ended["state"] == "terminated" and ended["cost"] is not None
    assert held_in_moto(aws_lab.ec2()) == {"instances": [], "key_pairs": [], "security_groups": []}
    assert not [i for i in instances() if i["state"] != "terminated"]


def test_a_fleet_keeps_an_instance_up_without_a_job_which_a_job_takes_until_the_fleet_goes(
    aws_lab: AwsLab, cloud_init: CloudInit, cloud_home: Path, tmp_path: Path
) -> None:
    from tests.e2e_cloud.test_cloud_ssh_fleets import fleet_machines, kept_idle, set_fleets

    write_providers(cloud_home, aws_lab, tmp_path)
    set_fleets(cloud_home, [{"name": "warm", "providers": ["aws"], "min_nodes": 1}])
    kept = wait_until(lambda: kept_idle("warm"), timeout=400, what="the fleet's instance")
    assert kept["job_id"] is None
    assert len(held_in_moto(aws_lab.ec2())["instances"]) == 1

    job_id, job_log = run_on_aws("on the fleet")
    assert "no launch and no bootstrap" in job_log
    (instance,) = status(job_id)["instances"]
    assert instance["instance_id"] == kept["instance_id"] and instance["fleet"] == "warm"
    wait_until(lambda: kept_idle("warm"), what="the instance to be the fleet's again")
    assert len(held_in_moto(aws_lab.ec2())["instances"]) == 1  # never a second one

    set_fleets(cloud_home, [])
    (ended,) = wait_for_teardown(job_id, cloud_init)
    assert ended["state"] == "terminated"
    assert not fleet_machines("warm")
    assert held_in_moto(aws_lab.ec2()) == {"instances": [], "key_pairs": [], "security_groups": []}
