"""A cloud on this machine: moto's EC2 server whose instances boot as sshd hosts of a lab.

moto keeps the books of a cloud (instances, key pairs, security groups, addresses) but runs no
machine. :class:`CloudInit` adds the machines: it watches moto for instances gpulayer launched
and, as cloud-init does when a real instance boots, brings each one up as an sshd host of the lab
(a machine of its own, as root) at the instance's private address, with the public key of the instance's key pair
authorized. A terminated instance's host is removed, with everything running on it.

The instances live on the lab's own network: :func:`lab_vpc` makes a VPC whose CIDR is the
lab's bridge network and one subnet of it per zone, so moto hands out addresses of the lab.
An instance with any other address is never booted, so only the lab's own namespaces are ever
targets.

moto runs as its own process with validation on, started by the AWS integration tests'
helpers (``tests/integration/aws``), which also give test-chosen error answers (faults).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import math
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.integration.aws.conftest import Moto, _start_server
from tests.support.shutdown import stop_services
from tests.support.sshd_hosts import LastLook, SshdHost, SshdLab

log = logging.getLogger(__name__)

JOB_TAG = "gpulayer:job"
SSH_USER_TAG = "gpulayer:ssh-user"
LAB_USER = "root"
BOOTING = frozenset({"pending", "running"})
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


@contextlib.contextmanager
def moto_server() -> Iterator[Moto]:
    """moto's EC2 server (AMI, instance type and key pair validation on) in its own process."""
    process, url = _start_server()
    try:
        yield Moto(url)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def ec2_client(url: str, region: str = "us-east-1") -> Any:
    """A boto3 EC2 client of moto that needs no credentials from the environment."""
    import boto3

    return boto3.client("ec2", region_name=region, endpoint_url=url, **CREDENTIALS)


def lab_vpc(ec2: Any, network: ipaddress.IPv4Network, zones: Sequence[str]) -> dict[str, str]:
    """A VPC whose CIDR is ``network`` (the lab's bridge network) cut into one subnet per zone.
    Returns zone -> subnet id. moto, like EC2, keeps each subnet's first addresses for itself,
    so the lab's gateway (the network's first address) is never handed to an instance."""
    if not zones:
        raise ValueError("zones: name at least one availability zone")
    vpc_id = ec2.create_vpc(CidrBlock=str(network))["Vpc"]["VpcId"]
    extra_bits = math.ceil(math.log2(len(zones))) if len(zones) > 1 else 0
    parts = list(network.subnets(prefixlen_diff=extra_bits))
    subnets = {}
    for zone, part in zip(zones, parts, strict=False):
        subnet = ec2.create_subnet(VpcId=vpc_id, CidrBlock=str(part), AvailabilityZone=zone)
        subnets[zone] = subnet["Subnet"]["SubnetId"]
    return subnets


def subnet_cidrs(ec2: Any, subnets: Mapping[str, str]) -> dict[str, ipaddress.IPv4Network]:
    """Zone -> the CIDR of its subnet, as moto has it."""
    found = ec2.describe_subnets(SubnetIds=list(subnets.values()))["Subnets"]
    by_id = {s["SubnetId"]: ipaddress.IPv4Network(s["CidrBlock"]) for s in found}
    return {zone: by_id[subnet_id] for zone, subnet_id in subnets.items()}


def write_image_catalog(folder: Path, release: str, aws_selector: Mapping[str, Any]) -> Path:
    """An images folder (for GPULAYER_IMAGES_DIR) whose only release names ``aws_selector``;
    the bootstrap script and cloud-init template are the project's own, linked."""
    return write_release(folder, release, {"aws": aws_selector})


def write_release(folder: Path, release: str, selectors: Mapping[str, Mapping[str, Any]]) -> Path:
    """An images folder whose only release has ``selectors`` (provider -> image selector)."""
    from gpulayer.cloud.images import find_images_dir

    source = find_images_dir()
    folder.mkdir(parents=True, exist_ok=True)
    catalog = {
        "schema": 1,
        "description": "The lab's images, booted as namespace hosts of this machine.",
        "releases": {
            release: {
                "date": "2030-01-01",
                "notes": "Instances boot as sshd hosts of the test lab.",
                "providers": {name: dict(selector) for name, selector in selectors.items()},
            }
        },
    }
    (folder / "releases.json").write_text(json.dumps(catalog, indent=2))
    for name in ("bootstrap.sh", "cloud-init.yaml"):
        link = folder / name
        if not link.exists() and (source / name).exists():
            link.symlink_to(source / name)
    return folder


@dataclass(frozen=True)
class Boot:
    """One instance brought up as a host: what the instance asked for at boot."""

    instance_id: str
    address: str
    host_name: str
    key_name: str
    ssh_user: str
    ssh_cidrs: tuple[str, ...]
    """Sources its security groups admit on port 22."""


class CloudInit:
    """Boots moto's instances tagged ``gpulayer:job`` as sshd hosts of ``lab`` and removes the
    host when the instance is terminated. Polls moto from a thread of its own; :meth:`stop`
    ends it and removes every host still up. Anything that went wrong is in :attr:`errors`."""

    def __init__(
        self,
        url: str,
        lab: SshdLab,
        *,
        region: str = "us-east-1",
        poll_seconds: float = 0.1,
    ) -> None:
        if not lab.namespaced or lab.subnet is None:
            raise ValueError("instances boot as network namespaces: the lab must be a netns lab")
        self.url = url
        self.lab = lab
        self.region = region
        self.poll_seconds = poll_seconds
        self._ec2: Any = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: set[str] = set()
        self._hosts: dict[str, SshdHost] = {}
        self.last_look = LastLook()
        """What watched folders held on each host when its instance ended."""
        self._booted: list[Boot] = []
        self._errors: list[str] = []
        self.passes = 0
        """Passes over moto's instances so far: a test waits for some to end, not for time."""

    # --- what it did ------------------------------------------------------------------------

    @property
    def booted(self) -> list[Boot]:
        with self._lock:
            return list(self._booted)

    @property
    def errors(self) -> list[str]:
        with self._lock:
            return list(self._errors)

    def hosts(self) -> dict[str, SshdHost]:
        """Instance id -> its host, for the instances up now."""
        with self._lock:
            return dict(self._hosts)

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._ec2 = ec2_client(self.url, self.region)
        self._thread = threading.Thread(target=self._loop, name="cloud-init", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for instance_id in list(self.hosts()):
            self._shut_down(instance_id)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.sync()
            except Exception as exc:
                self._error(f"polling moto failed: {type(exc).__name__}: {exc}")

    def _error(self, text: str) -> None:
        log.error("cloud-init: %s", text)
        with self._lock:
            self._errors.append(text)

    # --- one pass ---------------------------------------------------------------------------

    def sync(self) -> None:
        """Boot instances that appeared, remove hosts of instances that ended or vanished."""
        states = {}
        pages = self._ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "tag-key", "Values": [JOB_TAG]}]
        )
        for page in pages:
            for reservation in page.get("Reservations", []):
                for raw in reservation.get("Instances", []):
                    instance_id = raw["InstanceId"]
                    states[instance_id] = raw["State"]["Name"]
                    if states[instance_id] in BOOTING and instance_id not in self._seen:
                        if self._address_still_held(raw):
                            continue  # booted on a later pass, once the last holder is gone
                        self._seen.add(instance_id)  # one boot per instance, failed or not
                        try:
                            self._boot(raw)
                        except Exception as exc:
                            self._error(f"{instance_id}: boot failed: {type(exc).__name__}: {exc}")
        self.passes += 1
        for instance_id in list(self.hosts()):
            if states.get(instance_id) not in BOOTING:
                # A shutdown takes a while (the worker's jobs get their grace): boots and
                # other shutdowns go on meanwhile.
                threading.Thread(
                    target=self._shut_down, args=(instance_id,), name=f"shutdown-{instance_id}"
                ).start()

    def _address_still_held(self, raw: Mapping[str, Any]) -> bool:
        """moto gives a terminated instance's address to the next one at once, while the
        lab's host for the old instance may still be shutting down (its jobs get their
        grace). EC2 hands an address on only once its machine is gone, so the new one boots
        after that: until then its address answers as the old machine, or not at all."""
        address = raw.get("PrivateIpAddress")
        if not address:
            return False
        with self._lock:
            booted_here = any(h.address == address for h in self._hosts.values())
        return not booted_here and address in self.lab.addresses_taken()

    def _boot(self, raw: Mapping[str, Any]) -> None:
        instance_id = raw["InstanceId"]
        address = raw.get("PrivateIpAddress")
        assert self.lab.subnet is not None
        if not address or ipaddress.IPv4Address(address) not in self.lab.subnet:
            self._error(f"{instance_id}: address {address} is not on the lab's {self.lab.subnet}")
            return
        tags = {t["Key"]: t.get("Value", "") for t in raw.get("Tags", [])}
        # Namespace hosts (made by root) admit root only; an instance expecting another login
        # user would only ever be refused.
        user = tags.get(SSH_USER_TAG, "")
        if user != LAB_USER:
            self._error(f"{instance_id}: expects login user {user!r}; lab hosts admit {LAB_USER}")
            return
        key_name = raw.get("KeyName")
        if not key_name:
            self._error(f"{instance_id}: launched without a key pair, so nobody could log in")
            return
        pairs = self._ec2.describe_key_pairs(KeyNames=[key_name], IncludePublicKey=True)
        public_key = str(pairs["KeyPairs"][0]["PublicKey"]).strip()
        name = "ip-" + address.replace(".", "-")  # as EC2 names its instances' hosts
        host = self.lab.add_host(name, start=False, address=address)
        # As cloud-init writes the launch's key: the only key that logs in.
        host.set_authorized_keys(public_key + "\n")
        with self._lock:
            self._hosts[instance_id] = host
        host.start()
        boot = Boot(
            instance_id=instance_id,
            address=address,
            host_name=name,
            key_name=key_name,
            ssh_user=user,
            ssh_cidrs=self._ssh_sources(raw),
        )
        with self._lock:
            self._booted.append(boot)

    def _ssh_sources(self, raw: Mapping[str, Any]) -> tuple[str, ...]:
        group_ids = sorted(
            {g["GroupId"] for g in raw.get("SecurityGroups", [])}
            | {g["GroupId"] for n in raw.get("NetworkInterfaces", []) for g in n.get("Groups", [])}
        )
        if not group_ids:
            return ()
        groups = self._ec2.describe_security_groups(GroupIds=group_ids)["SecurityGroups"]
        sources = []
        for group in groups:
            for rule in group.get("IpPermissions", []):
                if rule.get("FromPort", 0) <= 22 <= rule.get("ToPort", 65535):
                    sources += [r["CidrIp"] for r in rule.get("IpRanges", [])]
                    sources += [r["CidrIpv6"] for r in rule.get("Ipv6Ranges", [])]
        return tuple(sorted(sources))

    def _shut_down(self, instance_id: str) -> None:
        with self._lock:
            host = self._hosts.pop(instance_id, None)
        if host is None:
            return
        try:
            stop_services(self.lab.pids_of(host))
        except Exception as exc:
            self._error(f"{instance_id}: stopping its services failed: {exc}")
        try:
            self.last_look.take(host)
            self.lab.remove_host(host)
        except Exception as exc:
            self._error(f"{instance_id}: removing its host failed: {exc}")
            return
        left = self.lab.host_leftovers(host)
        if left:
            self._error(f"{instance_id}: its host left behind {left}")
