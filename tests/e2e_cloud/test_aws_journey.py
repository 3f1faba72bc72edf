"""`gpulayer submit --target cloud --provider aws` end to end against moto's EC2 server.

moto launches an instance whose private address lies on the sshd lab's network; the lab's
cloud-init emulator boots it as an sshd host of the lab with the launch's key; the
orchestrator reaches it, bootstraps a worker over SSH, runs the job there and terminates it.
Afterwards moto holds no instance, key pair or security group of ours.

The image comes from a test image catalog (GPULAYER_IMAGES_DIR): the orchestrator hands every
launch the catalog's selector, which wins over the aws settings' ``image``. Its AMI is one moto
has; its login user is root, the user lab hosts admit. An instance is a machine of its own
(its own disk, processes and python3): the settings name its python3 and an install root there,
what the job left on its disk is looked at as the instance ends, and, since it still shares
this kernel, the dead-man switch only records what it would do.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e_cloud.journey import (
    last_job,
    ledger,
    wait_for_teardown,
    wait_until,
    why_it_failed,
)
from tests.integration.aws.conftest import Moto
from tests.support.cli import run_cli
from tests.support.moto_lab import (
    CloudInit,
    ec2_client,
    lab_vpc,
    moto_server,
    subnet_cidrs,
    write_image_catalog,
)
from tests.support.package_index import PackageIndex
from tests.support.sshd_hosts import SshdLab

ZONES = ("us-east-1a", "us-east-1b")
UBUNTU_AMIS = {"owners": ["099720109477"], "name": "ubuntu/images/hvm-ssd/ubuntu-*-amd64-server-*"}
PRINT_HOST = (
    "import socket, os; print('ran on', socket.gethostname(), os.environ['GPULAYER_JOB_ID'])"
)


@dataclass
class AwsLab:
    moto: Moto
    lab: SshdLab
    subnets: dict[str, str]
    cidrs: dict[str, ipaddress.IPv4Network]
    cache_dir: Path

    def ec2(self) -> Any:
        return ec2_client(self.moto.url)


@pytest.fixture(scope="module")
def moto(sshd_lab: SshdLab) -> Iterator[Moto]:
    if not sshd_lab.namespaced:
        pytest.skip("instances boot as network namespaces, which need root and iproute2")
    with moto_server() as handle:
        yield handle


@pytest.fixture(scope="module")
def aws_environment(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One environment for the whole module: the control plane keeps the one it started with."""
    folder = tmp_path_factory.mktemp("aws-env")
    images = write_image_catalog(folder / "images", "lab-1", {**UBUNTU_AMIS, "ssh_user": "root"})
    return {**dummy_aws_env(folder), "GPULAYER_IMAGES_DIR": str(images)}


def dummy_aws_env(folder: Path) -> dict[str, str]:
    """moto's dummy credentials, and no AWS configuration of this user read."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_CONFIG_FILE": str(folder / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(folder / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@pytest.fixture(scope="module")
def offer_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Instance types and zones never change in moto: fetched once for the module.
    return tmp_path_factory.mktemp("aws-cache")


@pytest.fixture
def aws_lab(
    moto: Moto,
    sshd_lab: SshdLab,
    aws_environment: dict[str, str],
    offer_cache: Path,
    cloud_home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> AwsLab:
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    for name, value in aws_environment.items():
        monkeypatch.setenv(name, value)
    moto.reset()
    assert sshd_lab.subnet is not None
    ec2 = ec2_client(moto.url)
    subnets = lab_vpc(ec2, sshd_lab.subnet, ZONES)
    return AwsLab(moto, sshd_lab, subnets, subnet_cidrs(ec2, subnets), offer_cache)


@pytest.fixture
def cloud_init(aws_lab: AwsLab) -> Iterator[CloudInit]:
    emulator = CloudInit(aws_lab.moto.url, aws_lab.lab)
    emulator.start()
    try:
        yield emulator
    finally:
        emulator.stop()
    assert emulator.errors == []


def write_providers(home: Path, aws: AwsLab, work: Path, **orchestrator: Any) -> Path:
    """providers.yaml with the aws provider on moto; returns the dead-man switch's record."""
    record = work / "deadman.jsonl"
    config = {
        "aws": aws_settings(aws, work),
        "gpulayer": {
            "deadman_seconds": 600,
            # Never the real power-off: the "instances" are this very machine.
            "deadman_action": f"record:{record}",
            "ssh_cidr": f"{aws.lab.gateway}/32",
            # moto's first listing of a region builds its whole instance-type table: under a
            # loaded machine that has taken longer than the default wait.
            "cloud_wait_seconds": 120,
            **orchestrator,
        },
    }
    (home / "providers.yaml").write_text(yaml.safe_dump(config))
    return record


def aws_settings(aws: AwsLab, work: Path) -> dict[str, Any]:
    """The aws provider on moto, launching into the lab's subnets."""
    install_root = work / "installs"  # on the instance: the bootstrap makes it there
    return {
        "regions": ["us-east-1"],
        "endpoint_url": aws.moto.url,
        "use_private_ip": True,
        "subnet_ids": aws.subnets,
        "price_source": "catalog",
        "cache_dir": str(aws.cache_dir),
        "python": "python3",  # an instance runs its own python3
        "install_root": str(install_root),
        "poll_seconds": 0.1,
        "terminate_timeout_seconds": 30,
    }


def aws_offers() -> list[dict[str, Any]]:
    result = run_cli(["offers", "--provider", "aws", "--json"])
    assert result.returncode == 0, result.stderr
    # Zones come from the live listing only: the catalog it falls back to names none.
    assert "live offers unavailable" not in result.stderr, result.stderr
    return list(json.loads(result.stdout))


def catalog_price(instance_type: str, region: str = "us-east-1") -> float:
    import gpulayer_aws

    path = Path(gpulayer_aws.__file__).parent / "data" / "price_catalog.json"
    return float(json.loads(path.read_text())["on_demand"][instance_type][region])


def newest_ami(ec2: Any) -> str:
    images = ec2.describe_images(
        Owners=UBUNTU_AMIS["owners"], Filters=[{"Name": "name", "Values": [UBUNTU_AMIS["name"]]}]
    )["Images"]
    newest = max(images, key=lambda i: (i["CreationDate"], i["Name"], i["ImageId"]))
    return str(newest["ImageId"])


def held_in_moto(ec2: Any) -> dict[str, list[str]]:
    """Instances not terminated, key pairs, and security groups other than the VPC defaults."""
    instances = [
        i["InstanceId"]
        for r in ec2.describe_instances()["Reservations"]
        for i in r["Instances"]
        if i["State"]["Name"] != "terminated"
    ]
    return {
        "instances": instances,
        "key_pairs": [k["KeyName"] for k in ec2.describe_key_pairs()["KeyPairs"]],
        "security_groups": [
            g["GroupName"]
            for g in ec2.describe_security_groups()["SecurityGroups"]
            if g["GroupName"] != "default"
        ],
    }


def test_aws_job_runs_on_a_moto_instance_booted_as_a_lab_host(
    aws_lab: AwsLab, cloud_init: CloudInit, cloud_home: Path, tmp_path: Path
) -> None:
    record = write_providers(cloud_home, aws_lab, tmp_path)
    cloud_init.last_look.watch(tmp_path, tmp_path / "installs")
    cheapest = aws_offers()[0]
    assert cheapest["zone"] == ZONES[0]

    result = run_cli(
        ["submit", "--target", "cloud", "--provider", "aws", "--", "python", "-c", PRINT_HOST],
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    job = last_job()
    assert job["state"] == "succeeded"
    request_id = job["attempts"][0]["worker_name"]

    (boot,) = cloud_init.booted
    assert f"ran on {boot.host_name} {job['id']}" in result.stdout
    assert ipaddress.IPv4Address(boot.address) in aws_lab.cidrs[ZONES[0]]
    assert boot.key_name == f"gpulayer-{request_id}"
    assert boot.ssh_cidrs == (f"{aws_lab.lab.gateway}/32",)  # SSH from the controller only
    assert "bootstrapping the worker" in result.stderr

    # The image is the test catalog's (the newest AMI its selector matches), on the offer taken.
    (launch,) = aws_lab.moto.calls("RunInstances")
    assert launch["ImageId"] == newest_ami(aws_lab.ec2())
    assert launch["InstanceType"] == cheapest["instance_type"]

    (instance,) = wait_for_teardown(job["id"], cloud_init)
    assert instance["provider"] == "aws" and instance["state"] == "terminated"
    assert instance["instance_id"] == boot.instance_id
    assert instance["zone"] == ZONES[0]
    assert instance["hourly_price"] == catalog_price(instance["instance_type"])
    assert instance["launched_at"] and instance["ready_at"] and instance["ended_at"]
    assert instance["cost"] is not None and instance["cost"] >= 0

    assert held_in_moto(aws_lab.ec2()) == {"instances": [], "key_pairs": [], "security_groups": []}
    # The instance's disk as it was when the instance ended: the bootstrap installed below the
    # install root, the job's dir was gone, and the worker never lost its control plane.
    disk = cloud_init.last_look.of(boot.host_name)
    installs, work = disk[str(tmp_path / "installs")], disk[str(tmp_path)]
    assert installs is not None and job["id"] not in installs, disk
    assert work is not None and record.name not in work, disk
    assert not list((cloud_home / "keys").glob(f"{request_id}*"))


@pytest.mark.slow
def test_a_gang_runs_on_two_moto_instances_launched_and_ended_together(
    aws_lab: AwsLab,
    cloud_init: CloudInit,
    cloud_home: Path,
    tmp_path: Path,
    torch_index: PackageIndex,
) -> None:
    from tests.e2e_cloud.test_cloud_ssh_gang import gang_job, rank_reports

    write_providers(cloud_home, aws_lab, tmp_path)  # the job brings torch: the hosts have none
    job_file = gang_job(tmp_path / "src", provider="aws", torch=torch_index)
    result = run_cli(["submit", "-f", str(job_file)], cwd=job_file.parent, timeout=400)
    job = last_job()
    assert result.returncode == 0, f"{why_it_failed(result.stderr)}\n{job}"

    # One call started both nodes, in one zone.
    (launch,) = aws_lab.moto.calls("RunInstances")
    assert (launch["MinCount"], launch["MaxCount"]) == ("2", "2")
    boots = cloud_init.booted
    assert len(boots) == 2 and len({b.address for b in boots}) == 2
    reports = rank_reports(result.stdout + result.stderr)
    assert sorted(r["rank"] for r in reports) == [0, 1]
    assert {r["world"] for r in reports} == {2}
    assert {r["env"]["GPULAYER_NODE_RANK"] for r in reports} == {"0", "1"}
    assert {r["env"]["MASTER_ADDR"] for r in reports} <= {b.address for b in boots}

    instances = wait_for_teardown(job["id"], cloud_init)
    assert sorted(i["instance_id"] for i in instances) == sorted(b.instance_id for b in boots)
    assert {i["state"] for i in instances} == {"terminated"}
    assert len({i["zone"] for i in instances}) == 1
    price = catalog_price(instances[0]["instance_type"])
    assert all(i["hourly_price"] == price for i in instances)  # each node at the offer's price
    assert ledger(job["id"])["total"]["USD"] == pytest.approx(sum(i["cost"] for i in instances))
    assert held_in_moto(aws_lab.ec2()) == {"instances": [], "key_pairs": [], "security_groups": []}
    assert not list((cloud_home / "keys").glob("r-*"))


def test_no_capacity_in_the_first_zone_moves_to_the_next(
    aws_lab: AwsLab, cloud_init: CloudInit, cloud_home: Path, tmp_path: Path
) -> None:
    write_providers(cloud_home, aws_lab, tmp_path)
    aws_lab.moto.fault(
        "RunInstances",
        "InsufficientInstanceCapacity",
        message="We currently do not have sufficient capacity in the Availability Zone",
        status=500,
        match={"Placement.AvailabilityZone": ZONES[0]},
    )
    result = run_cli(
        ["submit", "--target", "cloud", "--provider", "aws", "--", "python", "-c", PRINT_HOST],
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    job = last_job()
    assert job["state"] == "succeeded"
    assert "InsufficientInstanceCapacity" in result.stderr
    assert "blocking that zone" in result.stderr

    # EC2 answers capacity errors with HTTP 500, which botocore retries before giving up.
    zones = [c["Placement.AvailabilityZone"] for c in aws_lab.moto.calls("RunInstances")]
    assert list(dict.fromkeys(zones)) == list(ZONES) and zones.count(ZONES[1]) == 1
    (boot,) = cloud_init.booted
    assert ipaddress.IPv4Address(boot.address) in aws_lab.cidrs[ZONES[1]]
    assert f"ran on {boot.host_name} {job['id']}" in result.stdout

    instances = wait_for_teardown(job["id"], cloud_init)
    assert [(i["zone"], i["instance_id"], i["state"]) for i in instances] == [
        (ZONES[0], None, "never_launched"),  # refused for capacity: nothing was created
        (ZONES[1], boot.instance_id, "terminated"),
    ]
    # The failed launch's key pair and security group went with it.
    assert held_in_moto(aws_lab.ec2()) == {"instances": [], "key_pairs": [], "security_groups": []}


def test_rejected_credentials_fall_back_to_the_next_target(
    aws_lab: AwsLab, cloud_home: Path, tmp_path: Path
) -> None:
    write_providers(cloud_home, aws_lab, tmp_path)
    assert len({o["zone"] for o in aws_offers()}) == len(ZONES)  # offers now come from the cache
    aws_lab.moto.fault(
        "*",
        "AuthFailure",
        message="AWS was not able to validate the provided access credentials",
        status=401,
    )
    script = "import socket; print('fell back to', socket.gethostname())"
    result = run_cli(
        ["submit", "--target", "cloud", "--fallback", "local", "--", "python", "-c", script],
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert f"fell back to {socket.gethostname()}" in result.stdout
    assert "credentials rejected (AuthFailure" in result.stderr
    assert "blocking that provider" in result.stderr
    assert "trying target local" in result.stderr
    job = last_job()
    assert job["state"] == "succeeded" and job["target"] == "local"
    # One launch was tried: the provider was blocked, so the other zone's offer never was.
    (attempt,) = ledger(job["id"])["instances"]
    assert (attempt["zone"], attempt["instance_id"]) == (ZONES[0], None)
    # The provider refused the launch, so it created nothing: the record ends at once as
    # never launched, its key files gone.
    assert attempt["state"] == "never_launched"
    assert not list((cloud_home / "keys").glob(f"{attempt['request_id']}*"))
    assert aws_lab.moto.calls("ImportKeyPair") == aws_lab.moto.calls("RunInstances") == []

    # Naming the provider restricts provider-backed workers only: this machine still takes it.
    pinned = run_cli(
        [
            "submit", "--target", "cloud", "--provider", "aws", "--fallback", "local",
            "--", "python", "-c", script,
        ],
        timeout=300,
    )  # fmt: skip
    assert pinned.returncode == 0, pinned.stderr
    assert "credentials rejected (AuthFailure" in pinned.stderr
    assert f"fell back to {socket.gethostname()}" in pinned.stdout

    # Once credentials work again, the reaper finds nothing left of those launches.
    aws_lab.moto.reset()
    assert json.loads(run_cli(["reap", "--json"]).stdout) == []
    assert {i["state"] for i in ledger(job["id"])["instances"]} == {"never_launched"}


def test_a_cap_below_every_aws_offer_is_refused_at_submit_naming_the_cheapest(
    aws_lab: AwsLab, cloud_home: Path, tmp_path: Path
) -> None:
    write_providers(cloud_home, aws_lab, tmp_path)
    cheapest = aws_offers()[0]
    cap = 0.01
    assert cheapest["hourly_price"] > cap
    jobs_before = json.loads(run_cli(["ls", "--json", "-n", "1000"]).stdout)
    result = run_cli(
        [
            "submit", "--target", "cloud", "--provider", "aws", "--max-hourly-cost", str(cap),
            "--", "true",
        ],
        timeout=120,
    )  # fmt: skip
    # Known from the shipped catalog alone: refused before a job is made or AWS is asked.
    assert result.returncode == 2, result.stderr
    assert f"max_hourly_cost {cap} USD is below every offer" in result.stderr
    assert cheapest["instance_type"] in result.stderr
    assert f"{cheapest['hourly_price']} USD/h" in result.stderr
    assert json.loads(run_cli(["ls", "--json", "-n", "1000"]).stdout) == jobs_before
    assert aws_lab.moto.calls("ImportKeyPair") == aws_lab.moto.calls("RunInstances") == []


@pytest.mark.slow
def test_credentials_come_from_the_submit_or_the_files_when_the_job_needs_them(
    aws_lab: AwsLab,
    cloud_init: CloudInit,
    cloud_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import secrets

    from tests.support.daemon import stop_local_control_plane

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("GPULAYER_HOME", str(home))
    write_providers(home, aws_lab, tmp_path)
    credentials_file = tmp_path / "aws-credentials"
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials_file))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    try:
        # The local control plane starts in an environment without AWS credentials.
        assert run_cli(["ls"]).returncode == 0
        secret = "gl-" + secrets.token_hex(16)
        keys = {"AWS_ACCESS_KEY_ID": "AKIAGPULAYERTEST", "AWS_SECRET_ACCESS_KEY": secret}
        submit = ["submit", "--target", "cloud", "--provider", "aws", "--", "python", "-c"]
        # Keys exported afterwards, in the shell that submits, provision the job.
        result = run_cli([*submit, PRINT_HOST], env=keys, timeout=300)
        assert result.returncode == 0, why_it_failed(result.stderr)
        first = last_job()
        assert first["state"] == "succeeded", first
        wait_for_teardown(first["id"], cloud_init)
        # The same control plane reads a credentials file written after it started.
        credentials_file.write_text(
            f"[default]\naws_access_key_id = AKIAGPULAYERFILE\naws_secret_access_key = {secret}\n"
        )
        result = run_cli([*submit, PRINT_HOST], timeout=300)
        assert result.returncode == 0, why_it_failed(result.stderr)
        second = last_job()
        assert second["state"] == "succeeded", second
        wait_for_teardown(second["id"], cloud_init)
        assert held_in_moto(aws_lab.ec2())["instances"] == []
        # Neither the store nor any log holds the secret.
        for path in home.rglob("*"):
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), path
    finally:
        stop_local_control_plane(home)


def test_an_address_boots_a_new_instance_only_once_its_last_machine_is_gone(
    aws_lab: AwsLab, cloud_init: CloudInit
) -> None:
    """moto gives a terminated instance's address to the next instance at once; the lab boots
    that instance only once the machine that held the address has shut down (as EC2 hands an
    address on), and meanwhile the address answers as the old machine, never as two."""
    ec2 = aws_lab.ec2()
    ec2.create_key_pair(KeyName="lab-reuse")
    image = ec2.describe_images()["Images"][0]["ImageId"]
    tags = [
        {"Key": "gpulayer:job", "Value": "j-reuse"},
        {"Key": "gpulayer:ssh-user", "Value": "root"},
    ]

    def launch() -> dict[str, Any]:
        (instance,) = ec2.run_instances(
            ImageId=image,
            InstanceType="t3.medium",
            MinCount=1,
            MaxCount=1,
            KeyName="lab-reuse",
            # As the provider launches: the interface (and its address) goes with the instance.
            NetworkInterfaces=[
                {
                    "DeviceIndex": 0,
                    "SubnetId": aws_lab.subnets[ZONES[0]],
                    "DeleteOnTermination": True,
                }
            ],
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
        )["Instances"]
        return dict(instance)

    first = launch()
    wait_until(lambda: first["InstanceId"] in cloud_init.hosts(), what="the first boot")
    old_host = cloud_init.hosts()[first["InstanceId"]]
    # A worker slow to stop holds the machine's shutdown (and so its address) until killed.
    old_host.run(
        "setsid python3 -c 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        " time.sleep(600)' -m gpulayer worker start >/dev/null 2>&1 &",
        check=True,
    )
    wait_until(lambda: bool(slow_workers(aws_lab.lab, old_host)), what="the slow worker")
    ec2.terminate_instances(InstanceIds=[first["InstanceId"]])
    wait_until(lambda: first["InstanceId"] not in cloud_init.hosts(), what="the shutdown")

    second = launch()
    assert second["PrivateIpAddress"] == first["PrivateIpAddress"]  # moto hands it on at once
    seen = cloud_init.passes
    wait_until(lambda: cloud_init.passes >= seen + 5, what="cloud-init's passes")
    assert second["InstanceId"] not in cloud_init.hosts()
    assert first["PrivateIpAddress"] in aws_lab.lab.addresses_taken()  # the old machine's

    for pid in slow_workers(aws_lab.lab, old_host):
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: second["InstanceId"] in cloud_init.hosts(), what="the second boot")
    new_host = cloud_init.hosts()[second["InstanceId"]]
    assert new_host.address == first["PrivateIpAddress"] and new_host is not old_host
    assert cloud_init.errors == []
    ec2.terminate_instances(InstanceIds=[second["InstanceId"]])
    wait_until(lambda: not cloud_init.hosts(), what="the last shutdown")


def slow_workers(lab: SshdLab, host: Any) -> list[int]:
    found = []
    for pid in lab.pids_of(host):
        with contextlib.suppress(OSError):
            if b"worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return found
