"""Start one EC2 instance for a launch request, idempotently.

Per request: an imported key pair and a security group that admits SSH from the controller's
network only, both named after the request id, then run_instances with the request id as
ClientToken. A retried launch finds the instance by its request tag (or EC2 answers the same
ClientToken with the same instance) and returns it; key pair and group already present are
reused. When run_instances fails, the key pair and group are deleted again.

The nodes of a gang are one run_instances with MinCount = MaxCount = N, so EC2 starts all N
in the offer's zone or none; their group also admits all traffic from itself, so the nodes
reach each other and nothing else does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from gpulayer.cloud import (
    CapacityError,
    Instance,
    LaunchRequest,
    Offer,
    ProviderError,
    ProviderSettingsError,
    launch_zone,
)
from gpulayer_aws import tags as t
from gpulayer_aws.errors import PROVIDER, aws_errors, error_code
from gpulayer_aws.images import Image, resolve_image
from gpulayer_aws.instances import live_by_tags, to_instance
from gpulayer_aws.settings import AwsSettings
from gpulayer_aws.terminate import terminate_in_region as terminate_raws

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Placement:
    zone: str
    subnet_id: str
    vpc_id: str


def launch(ec2: Any, settings: AwsSettings, offer: Offer, request: LaunchRequest) -> Instance:
    if request.count != 1:
        raise ProviderError(
            "launch starts one instance; a gang goes to launch_gang", provider=PROVIDER
        )
    return launch_instances(ec2, settings, offer, request)[0]


def launch_instances(
    ec2: Any, settings: AwsSettings, offer: Offer, request: LaunchRequest
) -> list[Instance]:
    """``request.count`` instances of ``offer`` started together, in launch-index order."""
    region, zone = offer.region, launch_zone(offer, request, PROVIDER)
    with aws_errors(region, zone):
        existing = live_by_tags(ec2, {t.REQUEST: request.request_id})
    if existing:
        # Fewer never come from one MinCount call: some were ended from outside since.
        return _whole_gang(ec2, settings, request, (region, zone), existing, "are left")

    # The provider's own image setting wins over the newest release's default AMI; a release
    # the job names explicitly wins over both.
    if settings.image and request.image_release is None:
        selector = settings.image
    else:
        selector = request.image or settings.image
    if not selector:
        raise ProviderSettingsError(
            "image: no image selector in the launch request or the aws settings",
            provider=PROVIDER,
        )
    image = resolve_image(
        ec2, selector, region=region, cpu_arch=offer.cpu_arch, default_user=settings.ssh_user
    )
    place = _placement(ec2, settings, region, zone)
    base_tags = {
        **request.tags,
        t.OWNER: request.owner,
        t.JOB: request.job_id,
        t.REQUEST: request.request_id,
    }
    name = t.resource_name(request.request_id)
    with aws_errors(region, zone):
        _ensure_key_pair(ec2, name, request.ssh_public_key, base_tags)
        group_id = _ensure_security_group(ec2, name, place.vpc_id, request, base_tags)
    try:
        with aws_errors(region, zone):
            raws = _run_instances(ec2, settings, offer, request, image, place, name, group_id)
    except ProviderError:
        _remove_request_resources(ec2, name, group_id)
        raise
    return _whole_gang(ec2, settings, request, (region, zone), raws, "were started")


def _whole_gang(
    ec2: Any,
    settings: AwsSettings,
    request: LaunchRequest,
    where: tuple[str, str],
    raws: list[dict[str, Any]],
    what: str,
) -> list[Instance]:
    """The instances, when all the request asked for are there; else none are left."""
    region, zone = where
    if len(raws) < request.count:
        terminate_raws(ec2, settings, region, raws)
        message = f"only {len(raws)} of the gang's {request.count} instances {what}"
        raise CapacityError("zone", PROVIDER, region, zone, message)
    return _instances(raws, region, settings)


def _instances(raws: list[dict[str, Any]], region: str, settings: AwsSettings) -> list[Instance]:
    ordered = sorted(raws, key=lambda r: (int(r.get("AmiLaunchIndex") or 0), r["InstanceId"]))
    return [
        to_instance(raw, region, use_private_ip=settings.use_private_ip, ssh_user=settings.ssh_user)
        for raw in ordered
    ]


def _placement(ec2: Any, settings: AwsSettings, region: str, zone: str) -> Placement:
    subnet_id = settings.subnet_ids.get(zone)
    in_zone = {"Name": "availability-zone", "Values": [zone]}
    with aws_errors(region, zone):
        if subnet_id:
            subnets = ec2.describe_subnets(SubnetIds=[subnet_id])["Subnets"]
        elif settings.vpc_id:
            subnets = ec2.describe_subnets(
                Filters=[in_zone, {"Name": "vpc-id", "Values": [settings.vpc_id]}]
            )["Subnets"]
        else:
            subnets = ec2.describe_subnets(
                Filters=[in_zone, {"Name": "default-for-az", "Values": ["true"]}]
            )["Subnets"]
    if not subnets:
        where = f"VPC {settings.vpc_id}" if settings.vpc_id else "the default VPC"
        raise ProviderSettingsError(
            f"subnet_ids: no subnet for zone {zone} in {where}; name one in subnet_ids",
            provider=PROVIDER,
        )
    # Several subnets of one VPC in a zone: take the same one every time.
    subnet = min(subnets, key=lambda s: s["SubnetId"])
    if subnet["AvailabilityZone"] != zone:
        raise ProviderSettingsError(
            f"subnet_ids.{zone}: {subnet['SubnetId']} lies in {subnet['AvailabilityZone']}",
            provider=PROVIDER,
        )
    return Placement(zone=zone, subnet_id=subnet["SubnetId"], vpc_id=subnet["VpcId"])


def _ensure_key_pair(ec2: Any, name: str, public_key: str, tag_map: dict[str, str]) -> None:
    try:
        ec2.import_key_pair(
            KeyName=name,
            PublicKeyMaterial=public_key.encode(),
            TagSpecifications=t.specs(["key-pair"], tag_map),
        )
    except Exception as exc:
        if error_code(exc) != "InvalidKeyPair.Duplicate":
            raise


def _ensure_security_group(
    ec2: Any, name: str, vpc_id: str, request: LaunchRequest, tag_map: dict[str, str]
) -> str:
    try:
        group_id = ec2.create_security_group(
            GroupName=name,
            Description=f"gpulayer job {request.job_id}: SSH from the controller only",
            VpcId=vpc_id,
            TagSpecifications=t.specs(["security-group"], tag_map),
        )["GroupId"]
    except Exception as exc:
        if error_code(exc) != "InvalidGroup.Duplicate":
            raise
        group_id = ec2.describe_security_groups(
            Filters=[
                {"Name": "group-name", "Values": [name]},
                {"Name": "vpc-id", "Values": [vpc_id]},
            ]
        )["SecurityGroups"][0]["GroupId"]
    cidr = request.allowed_ssh_cidr
    ranges = (
        {"Ipv6Ranges": [{"CidrIpv6": cidr, "Description": "gpulayer controller"}]}
        if ":" in cidr
        else {"IpRanges": [{"CidrIp": cidr, "Description": "gpulayer controller"}]}
    )
    rules: list[dict[str, Any]] = [{"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, **ranges}]
    if request.count > 1:
        # The nodes of a gang talk to each other (rendezvous, gloo, NCCL) on any port.
        rules.append({"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id}]})
    for rule in rules:
        try:
            ec2.authorize_security_group_ingress(GroupId=group_id, IpPermissions=[rule])
        except Exception as exc:
            if error_code(exc) != "InvalidPermission.Duplicate":
                raise
    return str(group_id)


def _run_instances(
    ec2: Any,
    settings: AwsSettings,
    offer: Offer,
    request: LaunchRequest,
    image: Image,
    place: Placement,
    name: str,
    group_id: str,
) -> list[dict[str, Any]]:
    instance_tags = {
        "Name": f"gpulayer-{request.job_id}",
        **request.tags,
        t.OWNER: request.owner,
        t.JOB: request.job_id,
        t.REQUEST: request.request_id,
        t.SSH_USER: image.ssh_user,
    }
    if offer.hourly_price is not None:
        instance_tags[t.PRICE] = f"{offer.hourly_price:g}"
    if settings.python is not None:
        instance_tags[t.PYTHON] = settings.python
    if settings.install_root is not None:
        instance_tags[t.INSTALL_ROOT] = settings.install_root
    interface: dict[str, Any] = {
        "DeviceIndex": 0,
        "SubnetId": place.subnet_id,
        "Groups": [group_id],
        "AssociatePublicIpAddress": not settings.use_private_ip,
        "DeleteOnTermination": True,
    }
    if request.private_ip and request.count == 1:
        interface["PrivateIpAddress"] = request.private_ip
    params: dict[str, Any] = {
        "ImageId": image.ami_id,
        "InstanceType": offer.instance_type,
        # All of a gang or nothing: EC2 refuses the call when fewer than MinCount fit.
        "MinCount": request.count,
        "MaxCount": request.count,
        "KeyName": name,
        # EC2 answers a repeated token with the instance the first call started.
        "ClientToken": request.request_id,
        "Placement": {"AvailabilityZone": place.zone},
        "NetworkInterfaces": [interface],
        # A worker that powers itself off (its dead-man switch) ends the rental.
        "InstanceInitiatedShutdownBehavior": "terminate",
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        "TagSpecifications": t.specs(["instance", "volume", "network-interface"], instance_tags),
    }
    if request.disk_gb is not None and image.root_device_name:
        params["BlockDeviceMappings"] = [
            {
                "DeviceName": image.root_device_name,
                "Ebs": {
                    "VolumeSize": request.disk_gb,
                    "VolumeType": "gp3",
                    "DeleteOnTermination": True,
                },
            }
        ]
    if offer.spot:
        params["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {
                "SpotInstanceType": "one-time",
                "InstanceInterruptionBehavior": "terminate",
            },
        }
    return [dict(raw) for raw in ec2.run_instances(**params)["Instances"]]


def _remove_request_resources(ec2: Any, key_name: str, group_id: str) -> None:
    """Best effort after a failed launch: the error that caused it is what the caller needs."""
    for what, call in (
        ("security group", lambda: ec2.delete_security_group(GroupId=group_id)),
        ("key pair", lambda: ec2.delete_key_pair(KeyName=key_name)),
    ):
        try:
            call()
        except Exception as exc:
            log.warning("aws: could not delete the %s of a failed launch: %s", what, exc)
