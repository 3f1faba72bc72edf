"""Launch, describe, list and terminate against moto's EC2."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from gpulayer_aws import AwsProvider

from gpulayer.cloud.errors import ImageNotFoundError, ProviderError, ProviderSettingsError
from gpulayer.cloud.offer import Offer, OfferQuery
from gpulayer.cloud.protocol import LaunchRequest

from .conftest import Moto

MakeRequest = Callable[..., LaunchRequest]


def _offer(provider: AwsProvider, instance_type: str, zone: str, *, spot: bool = False) -> Offer:
    return next(
        o
        for o in provider.offers(OfferQuery(accelerator="cuda"))
        if o.instance_type == instance_type and o.zone == zone and o.spot is spot
    )


def _ours(moto: Moto, request_id: str) -> dict[str, list[Any]]:
    """What moto holds that carries our request tag (instances not yet terminated)."""
    ec2 = moto.ec2()
    tag = [{"Name": "tag:gpulayer:request", "Values": [request_id]}]
    live = [
        i
        for r in ec2.describe_instances(Filters=tag)["Reservations"]
        for i in r["Instances"]
        if i["State"]["Name"] != "terminated"
    ]
    return {
        "instances": live,
        "key_pairs": ec2.describe_key_pairs(Filters=tag)["KeyPairs"],
        "security_groups": ec2.describe_security_groups(Filters=tag)["SecurityGroups"],
    }


def test_launch_describe_terminate_leaves_nothing(
    moto: Moto, provider: AwsProvider, make_request: MakeRequest
) -> None:
    offer = _offer(provider, "g5.xlarge", "us-east-1b")
    request = make_request("req-life", disk_gb=120, tags={"team": "ml"})
    instance = provider.launch(offer, request)

    assert instance.state in ("pending", "running")
    assert (instance.provider, instance.region, instance.zone) == ("aws", "us-east-1", "us-east-1b")
    assert instance.instance_type == "g5.xlarge"
    assert instance.hourly_price == offer.hourly_price
    assert instance.ssh_user == "ubuntu" and instance.ssh_port == 22
    assert instance.ssh_host == instance.public_ip is not None
    assert instance.tags["gpulayer:owner"] == "owner-test"
    assert instance.tags["gpulayer:job"] == "job-1"
    assert instance.tags["team"] == "ml"

    held = _ours(moto, "req-life")
    assert [i["InstanceId"] for i in held["instances"]] == [instance.id]
    raw = held["instances"][0]
    assert raw["KeyName"] == "gpulayer-req-life"
    # SSH from the controller's network only, nothing else.
    (group,) = held["security_groups"]
    assert [
        (p["IpProtocol"], p["FromPort"], p["ToPort"], [r["CidrIp"] for r in p["IpRanges"]])
        for p in group["IpPermissions"]
    ] == [("tcp", 22, 22, ["203.0.113.7/32"])]
    assert len(held["key_pairs"]) == 1
    volumes = moto.ec2().describe_volumes(
        Filters=[{"Name": "attachment.instance-id", "Values": [instance.id]}]
    )["Volumes"]
    assert [v["Size"] for v in volumes] == [120]
    assert {"Key": "gpulayer:request", "Value": "req-life"} in volumes[0]["Tags"]
    attrs = moto.ec2().describe_instance_attribute(
        InstanceId=instance.id, Attribute="instanceInitiatedShutdownBehavior"
    )
    assert attrs["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"

    (described,) = AwsProvider(provider.settings).describe([instance.id])
    assert described.id == instance.id and described.state == "running"

    provider.terminate([instance.id])
    assert _ours(moto, "req-life") == {"instances": [], "key_pairs": [], "security_groups": []}
    (gone,) = provider.describe([instance.id])
    assert gone.state == "terminated"


def test_launch_is_idempotent_by_request_id(
    moto: Moto, provider: AwsProvider, make_request: MakeRequest
) -> None:
    offer = _offer(provider, "g6.xlarge", "us-east-1a")
    request = make_request("req-again")
    first = provider.launch(offer, request)
    # A fresh provider, as after a controller restart.
    second = AwsProvider(provider.settings).launch(offer, request)
    assert second.id == first.id
    assert len(moto.calls("RunInstances")) == 1
    held = _ours(moto, "req-again")
    assert (len(held["instances"]), len(held["key_pairs"]), len(held["security_groups"])) == (
        1,
        1,
        1,
    )
    provider.terminate([first.id])


def test_terminate_is_idempotent(
    moto: Moto, provider: AwsProvider, make_request: MakeRequest
) -> None:
    instance = provider.launch(_offer(provider, "g5.xlarge", "us-east-1a"), make_request("req-t"))
    provider.terminate([instance.id])
    provider.terminate([instance.id, "i-0123456789abcdef0"])
    AwsProvider(provider.settings).terminate([instance.id])
    provider.terminate([])
    assert _ours(moto, "req-t")["instances"] == []
    assert provider.describe(["i-0123456789abcdef0"]) == []


def test_list_owned_by_tags(moto: Moto, provider: AwsProvider, make_request: MakeRequest) -> None:
    offer = _offer(provider, "g4dn.xlarge", "us-east-1a")
    mine = provider.launch(offer, make_request("req-m1"))
    mine_too = provider.launch(offer, make_request("req-m2", job_id="job-2"))
    theirs = provider.launch(offer, make_request("req-o1", owner="someone-else"))

    owned = provider.list_owned({"gpulayer:owner": "owner-test"})
    assert sorted(i.id for i in owned) == sorted([mine.id, mine_too.id])
    by_job = provider.list_owned({"gpulayer:owner": "owner-test", "gpulayer:job": "job-2"})
    assert [i.id for i in by_job] == [mine_too.id]

    provider.terminate([mine.id])
    assert [i.id for i in provider.list_owned({"gpulayer:owner": "owner-test"})] == [mine_too.id]
    provider.terminate([mine_too.id, theirs.id])
    assert provider.list_owned({"gpulayer:owner": "owner-test"}) == []
    with pytest.raises(ProviderError, match="at least one tag"):
        provider.list_owned({})


def test_private_address_in_own_subnet(
    moto: Moto, settings: dict[str, Any], make_request: MakeRequest
) -> None:
    ec2 = moto.ec2()
    vpc = ec2.create_vpc(CidrBlock="10.231.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.231.0.0/24", AvailabilityZone="us-east-1c")[
        "Subnet"
    ]["SubnetId"]
    provider = AwsProvider(
        {**settings, "subnet_ids": {"us-east-1c": subnet}, "use_private_ip": True}
    )
    offer = _offer(provider, "g5.xlarge", "us-east-1c")
    instance = provider.launch(offer, make_request("req-priv", private_ip="10.231.0.17"))
    assert instance.private_ip == instance.ssh_host == "10.231.0.17"
    raw = ec2.describe_instances(InstanceIds=[instance.id])["Reservations"][0]["Instances"][0]
    assert raw["SubnetId"] == subnet
    (group,) = _ours(moto, "req-priv")["security_groups"]
    assert group["VpcId"] == vpc
    provider.terminate([instance.id])
    assert _ours(moto, "req-priv")["security_groups"] == []


def test_spot_launch(moto: Moto, settings: dict[str, Any], make_request: MakeRequest) -> None:
    provider = AwsProvider({**settings, "allow_spot": True})
    offer = _offer(provider, "g5.xlarge", "us-east-1a", spot=True)
    with pytest.raises(ProviderError, match="does not accept spot"):
        provider.launch(offer, make_request("req-spot"))
    assert moto.calls("RunInstances") == []
    instance = provider.launch(offer, make_request("req-spot", spot=True))
    assert instance.spot is True
    assert instance.hourly_price == offer.hourly_price
    provider.terminate([instance.id])


def test_image_selection(moto: Moto, settings: dict[str, Any], make_request: MakeRequest) -> None:
    provider = AwsProvider({**settings, "image": {}})
    offer = _offer(provider, "g5.xlarge", "us-east-1a")
    with pytest.raises(ProviderSettingsError, match="image"):
        provider.launch(offer, make_request("req-noimage"))

    ec2 = moto.ec2()
    ubuntu = ec2.describe_images(Owners=["099720109477"])["Images"]
    newest = max(ubuntu, key=lambda i: (i["CreationDate"], i["Name"], i["ImageId"]))
    # A release the job names explicitly brings its own image.
    by_name = provider.launch(
        offer,
        make_request(
            "req-name", image={**settings["image"], "ssh_user": "admin"}, image_release="r1"
        ),
    )
    raw = ec2.describe_instances(InstanceIds=[by_name.id])["Reservations"][0]["Instances"][0]
    assert raw["ImageId"] == newest["ImageId"]
    assert by_name.ssh_user == "admin"

    other = next(i for i in ubuntu if i["ImageId"] != newest["ImageId"])
    pinned = {"ami_ids": {"us-east-1": other["ImageId"]}}
    by_id = provider.launch(offer, make_request("req-id", image=pinned, image_release="r1"))
    raw = ec2.describe_instances(InstanceIds=[by_id.id])["Reservations"][0]["Instances"][0]
    assert raw["ImageId"] == other["ImageId"]

    # The provider's image setting wins over the newest release's default (no release named).
    configured = AwsProvider({**settings, "image": pinned})
    by_setting = configured.launch(offer, make_request("req-set", image=settings["image"]))
    raw = ec2.describe_instances(InstanceIds=[by_setting.id])["Reservations"][0]["Instances"][0]
    assert raw["ImageId"] == other["ImageId"] != newest["ImageId"]
    configured.terminate([by_setting.id])

    with pytest.raises(ImageNotFoundError, match="no AMI matches"):
        provider.launch(
            offer, make_request("req-none", image={"owners": ["099720109477"], "name": "nope-*"})
        )
    arm = _offer(provider, "g5g.xlarge", "us-east-1a")
    with pytest.raises(ImageNotFoundError, match="arm64"):
        provider.launch(arm, make_request("req-arm", image=settings["image"]))
    with pytest.raises(ProviderSettingsError, match=r"image\.ami"):
        provider.launch(offer, make_request("req-bad", image={"ami": "x"}))
    assert _ours(moto, "req-none")["key_pairs"] == []
    provider.terminate([by_name.id, by_id.id])


def test_vpc_setting_picks_a_subnet_of_that_vpc(
    moto: Moto, settings: dict[str, Any], make_request: MakeRequest
) -> None:
    ec2 = moto.ec2()
    vpc = ec2.create_vpc(CidrBlock="10.40.0.0/16")["Vpc"]["VpcId"]
    subnets = sorted(
        ec2.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone="us-east-1d")["Subnet"][
            "SubnetId"
        ]
        for cidr in ("10.40.1.0/24", "10.40.2.0/24")
    )
    provider = AwsProvider({**settings, "vpc_id": vpc})
    instance = provider.launch(_offer(provider, "g5.xlarge", "us-east-1d"), make_request("req-vpc"))
    raw = ec2.describe_instances(InstanceIds=[instance.id])["Reservations"][0]["Instances"][0]
    assert raw["SubnetId"] == subnets[0]
    with pytest.raises(ProviderSettingsError, match="no subnet for zone us-east-1a in VPC"):
        provider.launch(_offer(provider, "g5.xlarge", "us-east-1a"), make_request("req-vpc-a"))
    assert _ours(moto, "req-vpc-a")["key_pairs"] == []
    provider.terminate([instance.id])


def test_a_security_group_still_in_use_is_deleted_once_released(
    moto: Moto, provider: AwsProvider, make_request: MakeRequest
) -> None:
    # EC2 refuses to delete a group a terminated instance's interface still holds for a while.
    instance = provider.launch(_offer(provider, "g5.xlarge", "us-east-1a"), make_request("req-sg"))
    moto.fault("DeleteSecurityGroup", "DependencyViolation", times=2)
    provider.terminate([instance.id])
    assert _ours(moto, "req-sg") == {"instances": [], "key_pairs": [], "security_groups": []}
    assert len(moto.calls("DeleteSecurityGroup")) == 3


def test_a_security_group_that_stays_in_use_fails_the_terminate_in_time(
    moto: Moto, settings: dict[str, Any], make_request: MakeRequest
) -> None:
    provider = AwsProvider(settings | {"terminate_timeout_seconds": 2})
    instance = provider.launch(_offer(provider, "g5.xlarge", "us-east-1a"), make_request("req-sg2"))
    moto.fault("DeleteSecurityGroup", "DependencyViolation")
    with pytest.raises(ProviderError, match="DependencyViolation"):
        provider.terminate([instance.id])
    assert len(moto.calls("DeleteSecurityGroup")) >= 2  # waited, then gave up
    assert len(_ours(moto, "req-sg2")["security_groups"]) == 1
