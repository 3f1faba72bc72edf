"""`gpulayer submit --target cloud --provider gcp` end to end against a Compute REST server.

The test server (tests/support/gce_server.py) gives each inserted instance the next internal
address of the sshd lab's network and boots it as an sshd host of the lab with the key
from its ``ssh-keys`` metadata; the orchestrator reaches it, bootstraps a worker over SSH, runs
the job there and deletes it. Afterwards the server holds no instance or firewall rule.

Credentials come through google-auth's default chain: GOOGLE_APPLICATION_CREDENTIALS names a
service-account key whose token endpoint is the test server's. The image comes from a test
image catalog (GPULAYER_IMAGES_DIR) naming an image family the server has; its login user is
root, the user lab hosts admit. An instance is a machine of its own (its own disk, processes
and python3): the settings name its python3 and an install root there, what the job left on
its disk is looked at as the instance ends, and, since it still shares this kernel, the
dead-man switch only records what it would do.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e_cloud.journey import last_job, ledger, wait_for_teardown, wait_until, why_it_failed
from tests.e2e_cloud.test_aws_journey import (
    UBUNTU_AMIS,
    AwsLab,
    aws_lab,
    aws_settings,
    cloud_init,
    dummy_aws_env,
    moto,
    offer_cache,
)
from tests.support.cli import run_cli
from tests.support.gce_server import (
    PROJECT,
    ComputeServer,
    ZoneShape,
    compute_server,
    isolated_google_env,
    service_account_file,
)
from tests.support.moto_lab import CloudInit, write_release
from tests.support.package_index import PackageIndex
from tests.support.sshd_hosts import SshdLab

__all__ = ["aws_lab", "cloud_init", "moto", "offer_cache"]

IMAGE_PROJECT = "gpulayer-lab-images"
FAMILY = "lab-worker"
CPU_TYPES = {
    "n1-standard-1": (1, 3840, None, 0),
    "n1-standard-2": (2, 7680, None, 0),
    "e2-standard-2": (2, 8192, None, 0),
}
ZONES = {
    "us-central1-a": ZoneShape(dict(CPU_TYPES), {"nvidia-tesla-t4": 4}),
    "us-central1-b": ZoneShape(dict(CPU_TYPES), {"nvidia-tesla-t4": 4}),
    "us-east4-a": ZoneShape(dict(CPU_TYPES), {}),
}
PRINT_HOST = (
    "import socket, os; print('ran on', socket.gethostname(), os.environ['GPULAYER_JOB_ID'])"
)


@pytest.fixture(scope="module")
def gce(sshd_lab: SshdLab) -> Iterator[ComputeServer]:
    if not sshd_lab.namespaced:
        pytest.skip("instances boot as network namespaces, which need root and iproute2")
    with compute_server(
        ZONES, lab=sshd_lab, images={(IMAGE_PROJECT, FAMILY): "lab-worker-20300101"}
    ) as server:
        yield server


@pytest.fixture(scope="module")
def cloud_environment(
    tmp_path_factory: pytest.TempPathFactory, gce: ComputeServer
) -> dict[str, str]:
    """One environment for the whole module: the control plane keeps the one it started
    with. It has Google credentials (a service account of the test server) and AWS's dummy
    ones, so that one control plane serves both providers."""
    folder = tmp_path_factory.mktemp("gcp-env")
    images = write_release(
        folder / "images",
        "lab-1",
        {
            "gcp": {"project": IMAGE_PROJECT, "family": FAMILY, "ssh_user": "root"},
            "aws": {**UBUNTU_AMIS, "ssh_user": "root"},
        },
    )
    key = service_account_file(folder / "google", f"{gce.url}/token")
    return {
        **isolated_google_env(folder),
        "GOOGLE_APPLICATION_CREDENTIALS": str(key),
        **dummy_aws_env(folder),
        "GPULAYER_IMAGES_DIR": str(images),
    }


@pytest.fixture(scope="module")
def aws_environment(cloud_environment: dict[str, str]) -> dict[str, str]:
    # The AWS journey's fixtures, with this module's environment (both providers' images).
    return cloud_environment


@pytest.fixture
def gcp_lab(
    gce: ComputeServer,
    cloud_environment: dict[str, str],
    cloud_home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[ComputeServer]:
    for name, value in cloud_environment.items():
        monkeypatch.setenv(name, value)
    gce.reset()
    yield gce
    assert gce.errors == []


def gcp_settings(gce: ComputeServer, work: Path) -> dict[str, Any]:
    install_root = work / "installs"  # on the instance: the bootstrap makes it there
    return {
        "project": PROJECT,
        "regions": ["us-central1", "us-east4"],
        "endpoint_url": gce.url,
        "use_private_ip": True,
        "cache_dir": str(work / "gcp-cache"),
        "python": "python3",  # an instance runs its own python3
        "install_root": str(install_root),
        "operation_timeout_seconds": 60,
    }


def write_providers(
    home: Path, gce: ComputeServer, work: Path, *, aws: AwsLab | None = None, **orchestrator: Any
) -> Path:
    """providers.yaml with gcp on the test server (and aws on moto when given); returns the
    dead-man switch's record."""
    record = work / "deadman.jsonl"
    config: dict[str, Any] = {
        "gcp": gcp_settings(gce, work),
        "gpulayer": {
            "deadman_seconds": 600,
            # Never the real power-off: the "instances" are this very machine.
            "deadman_action": f"record:{record}",
            "ssh_cidr": f"{gce.lab.gateway if gce.lab else '127.0.0.1'}/32",
            **orchestrator,
        },
    }
    if aws is not None:
        config["aws"] = aws_settings(aws, work)
    (home / "providers.yaml").write_text(yaml.safe_dump(config))
    return record


def gcp_offers(*extra: str) -> list[dict[str, Any]]:
    result = run_cli(["offers", "--provider", "gcp", "--json", *extra])
    assert result.returncode == 0, result.stderr
    return list(json.loads(result.stdout))


def catalog_price(machine_type: str, region: str = "us-central1") -> float:
    import gpulayer_gcp

    path = Path(gpulayer_gcp.__file__).parent / "data" / "price_catalog.json"
    return float(json.loads(path.read_text())["regions"][region]["machines"][machine_type][0])


def held(gce: ComputeServer) -> dict[str, list[str]]:
    return {
        "instances": sorted(name for _, name in gce.instances),
        "firewalls": sorted(gce.firewalls),
    }


def submit_gcp(*extra: str, command: tuple[str, ...] = ("python", "-c", PRINT_HOST)) -> Any:
    return run_cli(
        ["submit", "--target", "cloud", "--provider", "gcp", *extra, "--", *command],
        timeout=300,
    )


def test_gcp_job_runs_on_an_instance_booted_as_a_lab_host(
    gcp_lab: ComputeServer, cloud_home: Path, tmp_path: Path
) -> None:
    record = write_providers(cloud_home, gcp_lab, tmp_path)
    gcp_lab.last_look.watch(tmp_path, tmp_path / "installs")
    cheapest = gcp_offers()[0]
    assert (cheapest["zone"], cheapest["instance_type"]) == ("us-central1-a", "n1-standard-1")
    assert cheapest["enabled"] is True

    result = submit_gcp()
    assert result.returncode == 0, result.stderr
    job = last_job()
    assert job["state"] == "succeeded"
    request_id = job["attempts"][0]["worker_name"]

    (boot,) = gcp_lab.booted
    assert f"ran on {boot.host_name} {job['id']}" in result.stdout
    assert boot.name == f"gpulayer-{request_id}" and boot.zone == "us-central1-a"
    assert gcp_lab.lab is not None and gcp_lab.lab.subnet is not None
    assert ipaddress.IPv4Address(boot.address) in gcp_lab.lab.subnet
    assert boot.ssh_cidrs == (f"{gcp_lab.lab.gateway}/32",)  # SSH from the controller only

    (insert,) = gcp_lab.calls("instances.insert")
    body = insert["body"]
    assert body["machineType"].endswith("/n1-standard-1")
    assert body["disks"][0]["initializeParams"]["sourceImage"].endswith(
        f"/projects/{IMAGE_PROJECT}/global/images/lab-worker-20300101"
    )
    assert body["labels"]["gpulayer-job"] == job["id"]
    assert body["labels"]["gpulayer-request"] == request_id
    assert body["tags"]["items"] == [boot.name]
    assert insert["requestId"]  # idempotent inserts
    (rule,) = [c["body"] for c in gcp_lab.calls("firewalls.insert")]
    assert rule["targetTags"] == [boot.name] and rule["sourceRanges"] == list(boot.ssh_cidrs)

    (instance,) = wait_for_teardown(job["id"], gcp_lab)
    assert instance["provider"] == "gcp" and instance["state"] == "terminated"
    assert instance["instance_id"] == f"us-central1-a/{boot.name}"
    assert instance["hourly_price"] == catalog_price("n1-standard-1")
    assert instance["launched_at"] and instance["ready_at"] and instance["ended_at"]

    assert held(gcp_lab) == {"instances": [], "firewalls": []}
    assert [c["name"] for c in gcp_lab.calls("firewalls.delete")] == [boot.name]
    # The instance's disk as it was when the instance ended: the bootstrap installed below the
    # install root, the job's dir was gone, and the worker never lost its control plane.
    disk = gcp_lab.last_look.of(boot.host_name)
    installs, work = disk[str(tmp_path / "installs")], disk[str(tmp_path)]
    assert installs is not None and job["id"] not in installs, disk
    assert work is not None and record.name not in work, disk
    assert not list((cloud_home / "keys").glob(f"{request_id}*"))


@pytest.mark.slow
def test_a_gang_runs_on_two_gce_instances_in_one_zone_and_ends_together(
    gcp_lab: ComputeServer, cloud_home: Path, tmp_path: Path, torch_index: PackageIndex
) -> None:
    from tests.e2e_cloud.test_cloud_ssh_gang import gang_job, rank_reports

    write_providers(cloud_home, gcp_lab, tmp_path)  # the job brings torch: the hosts have none
    job_file = gang_job(tmp_path / "src", provider="gcp", torch=torch_index)
    result = run_cli(["submit", "-f", str(job_file)], cwd=job_file.parent, timeout=400)
    job = last_job()
    assert result.returncode == 0, f"{why_it_failed(result.stderr)}\n{job}"

    # Two nodes, each inserted with a request id of its own, in one zone, under one tag.
    inserts = gcp_lab.calls("instances.insert")
    assert len(inserts) == 2 and len({c["requestId"] for c in inserts}) == 2
    boots = gcp_lab.booted
    assert len(boots) == 2 and len({b.zone for b in boots}) == 1
    assert len({b.address for b in boots}) == 2
    (tag,) = {tuple(c["body"]["tags"]["items"]) for c in inserts}
    (rule,) = [c["body"] for c in gcp_lab.calls("firewalls.insert")]
    assert rule["targetTags"] == list(tag) and rule["sourceTags"] == list(tag)
    assert rule["sourceRanges"] == [f"{gcp_lab.lab.gateway}/32"] if gcp_lab.lab else True
    reports = rank_reports(result.stdout + result.stderr)
    assert sorted(r["rank"] for r in reports) == [0, 1]
    assert {r["env"]["GPULAYER_NODE_RANK"] for r in reports} == {"0", "1"}
    assert {r["env"]["MASTER_ADDR"] for r in reports} <= {b.address for b in boots}

    instances = wait_for_teardown(job["id"], gcp_lab)
    assert {i["state"] for i in instances} == {"terminated"} and len(instances) == 2
    assert held(gcp_lab) == {"instances": [], "firewalls": []}
    assert not list((cloud_home / "keys").glob("r-*"))


def test_a_gang_that_cannot_be_had_whole_leaves_nothing(
    gcp_lab: ComputeServer, cloud_home: Path, tmp_path: Path
) -> None:
    """Node 1's insert is refused for capacity: node 0 is deleted with the rule, and the
    job, with no other zone to go to, fails saying why."""
    from tests.e2e_cloud.test_cloud_ssh_gang import gang_job

    write_providers(cloud_home, gcp_lab, tmp_path)
    job_file = gang_job(tmp_path / "src", provider="gcp", max_hourly_cost=0.06)
    gcp_lab.fault(
        "instances.insert",
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        message="The zone does not have enough resources",
        match={"body_name_suffix": "-n1"},
    )
    result = run_cli(["submit", "-f", str(job_file)], cwd=job_file.parent, timeout=300)
    job = last_job()
    assert result.returncode != 0 and job["state"] == "failed", (result.stderr[-2000:], job)
    assert any(c["body"]["name"].endswith("-n1") for c in gcp_lab.calls("instances.insert"))
    wait_until(lambda: held(gcp_lab) == {"instances": [], "firewalls": []}, what="nothing held")


def test_an_exhausted_first_zone_moves_to_the_next(
    gcp_lab: ComputeServer, cloud_home: Path, tmp_path: Path
) -> None:
    write_providers(cloud_home, gcp_lab, tmp_path)
    gcp_lab.fault(
        "instances.insert",
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        message="The zone 'projects/gpulayer-lab/zones/us-central1-a' does not have enough "
        "resources available to fulfill the request.",
        match={"zone": "us-central1-a"},
    )
    result = submit_gcp()
    assert result.returncode == 0, result.stderr
    job = last_job()
    assert job["state"] == "succeeded"
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in result.stderr
    assert "blocking that zone" in result.stderr

    zones = [c["zone"] for c in gcp_lab.calls("instances.insert")]
    assert zones == ["us-central1-a", "us-central1-b"]
    (boot,) = gcp_lab.booted
    assert boot.zone == "us-central1-b"
    assert f"ran on {boot.host_name} {job['id']}" in result.stdout

    instances = wait_for_teardown(job["id"], gcp_lab)
    assert [(i["zone"], i["state"]) for i in instances] == [
        ("us-central1-a", "never_launched"),  # refused: nothing was created there
        ("us-central1-b", "terminated"),
    ]
    # The refused launch's firewall rule went with it.
    assert held(gcp_lab) == {"instances": [], "firewalls": []}


def test_a_quota_error_moves_to_the_next_region(
    gcp_lab: ComputeServer, cloud_home: Path, tmp_path: Path
) -> None:
    write_providers(cloud_home, gcp_lab, tmp_path)
    gcp_lab.fault(
        "instances.insert",
        "QUOTA_EXCEEDED",
        message="Quota 'CPUS' exceeded.  Limit: 0.0 in region us-central1.",
        match={"zone": "us-central1-a"},
    )
    result = submit_gcp()
    assert result.returncode == 0, result.stderr
    assert "QUOTA_EXCEEDED" in result.stderr and "blocking that region" in result.stderr
    job = last_job()
    assert job["state"] == "succeeded"
    # The region's other zone is never tried: quotas hold for the whole region.
    zones = [c["zone"] for c in gcp_lab.calls("instances.insert")]
    assert zones == ["us-central1-a", "us-east4-a"]
    (boot,) = gcp_lab.booted
    assert boot.zone == "us-east4-a"
    (first, second) = wait_for_teardown(job["id"], gcp_lab)
    assert first["state"] == "never_launched" and second["state"] == "terminated"
    assert second["hourly_price"] == catalog_price("n1-standard-1", "us-east4")
    assert held(gcp_lab) == {"instances": [], "firewalls": []}


def test_rejected_credentials_fall_back_to_aws_then_to_local(
    gcp_lab: ComputeServer,
    aws_lab: AwsLab,
    cloud_init: CloudInit,
    cloud_home: Path,
    tmp_path: Path,
) -> None:
    write_providers(cloud_home, gcp_lab, tmp_path, aws=aws_lab)
    gcp_lab.reject_credentials()
    script = "import socket; print('ran on', socket.gethostname())"
    result = run_cli(
        ["submit", "--target", "cloud", "--fallback", "local", "--", "python", "-c", script],
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "gcp: no offers" in result.stderr and "credentials rejected" in result.stderr
    job = last_job()
    assert job["state"] == "succeeded" and job["target"] == "cloud"
    (boot,) = cloud_init.booted  # an AWS instance on moto
    # The job prints unbuffered, in pieces; a stall between them may end a log line early.
    assert f"ran on {boot.host_name}" in " ".join(result.stdout.split())
    (instance,) = ledger(job["id"])["instances"]
    assert instance["provider"] == "aws"
    assert gcp_lab.calls("instances.insert") == [] and gcp_lab.booted == []
    wait_until(lambda: not cloud_init.hosts(), what="the AWS instance's host to go")

    # AWS refuses too (at launch; its offers come from the cache): the job runs here.
    aws_lab.moto.fault("ImportKeyPair", "UnauthorizedOperation", message="not allowed")
    fallback = run_cli(
        ["submit", "--target", "cloud", "--fallback", "local", "--", "python", "-c", script],
        timeout=300,
    )
    assert fallback.returncode == 0, fallback.stderr
    assert f"ran on {socket.gethostname()}" in fallback.stdout
    assert "trying target local" in fallback.stderr
    assert "credentials rejected (UnauthorizedOperation" in fallback.stderr
    job = last_job()
    assert job["state"] == "succeeded" and job["target"] == "local"
    assert gcp_lab.calls("instances.insert") == [] and held(gcp_lab) == {
        "instances": [],
        "firewalls": [],
    }
    aws_lab.moto.reset()


def test_a_cap_below_every_gcp_offer_is_refused_at_submit_naming_the_cheapest(
    gcp_lab: ComputeServer, cloud_home: Path, tmp_path: Path
) -> None:
    write_providers(cloud_home, gcp_lab, tmp_path)
    cheapest = gcp_offers()[0]
    cap = 0.01
    assert cheapest["hourly_price"] > cap
    jobs_before = json.loads(run_cli(["ls", "--json", "-n", "1000"]).stdout)
    result = submit_gcp("--max-hourly-cost", str(cap), command=("true",))
    # Known from the shipped catalog alone: refused before a job is made or GCP is asked.
    assert result.returncode == 2, result.stderr
    assert f"max_hourly_cost {cap} USD is below every offer" in result.stderr
    assert cheapest["instance_type"] in result.stderr
    assert f"{cheapest['hourly_price']} USD/h" in result.stderr
    assert json.loads(run_cli(["ls", "--json", "-n", "1000"]).stdout) == jobs_before
    assert gcp_lab.calls("instances.insert") == gcp_lab.calls("firewalls.insert") == []


@pytest.mark.slow
def test_a_preemption_of_one_gang_node_ends_the_whole_gang(
    gcp_lab: ComputeServer, cloud_home: Path, tmp_path: Path, torch_index: PackageIndex
) -> None:
    """GCE preempts node 1 alone (the instance deleted, a `preempted` operation left behind):
    the gang ends as preempted on every node, and node 0's instance and the rule go too."""
    from tests.e2e_cloud.test_cloud_ssh_gang import gang_in_torchrun
    from tests.e2e_cloud.test_cloud_ssh_lifecycle import instances, status

    # The reclaimed offer is held (checked below) for a second only: this module's other jobs
    # share the store and its held offers.
    write_providers(cloud_home, gcp_lab, tmp_path, hold_reclaimed_seconds=1)
    job_id, nodes = gang_in_torchrun(tmp_path / "src", "gcp", torch_index)
    zone, name = nodes[1]["instance_id"].split("/")  # a GCE instance's id: zone/name
    gcp_lab.preempt(zone, name)

    wait_until(lambda: status(job_id)["state"] == "failed", timeout=240, what="the gang to end")
    job = status(job_id)
    ends = [(a["node_rank"], a["reason"], a.get("message")) for a in job["attempts"]]
    assert job["reason"] == "preempted", (job["message"], ends)
    assert sorted(a["node_rank"] for a in job["attempts"]) == [0, 1]
    assert {a["state"] for a in job["attempts"]} == {"failed"}
    rows = wait_for_teardown(job_id, gcp_lab)
    assert len(rows) == 2 and {i["state"] for i in rows} == {"terminated"}
    ended = {i["node_rank"]: i for i in instances("--job", job_id)}
    assert ended[1]["outcome"] == "reclaimed" and ended[1]["offer_held_until"], ended[1]
    assert held(gcp_lab) == {"instances": [], "firewalls": []}
