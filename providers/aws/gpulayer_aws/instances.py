"""EC2 instances as gpulayer Instances, and the lookups describe, list_owned and launch use."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpulayer.cloud import Instance, InstanceState
from gpulayer_aws import tags as t
from gpulayer_aws.errors import PROVIDER

# EC2 state -> gpulayer state. "stopped" cannot normally happen (instances terminate on
# shutdown), but if someone stops one it is on its way out as far as a job is concerned.
_STATES: dict[str, InstanceState] = {
    "pending": "pending",
    "running": "running",
    "stopping": "stopping",
    "stopped": "stopping",
    "shutting-down": "stopping",
    "terminated": "terminated",
}
NOT_TERMINATED = ["pending", "running", "stopping", "stopped", "shutting-down"]
SPOT_RECLAIM = "Server.SpotInstanceTermination"


def to_instance(
    raw: Mapping[str, Any], region: str, *, use_private_ip: bool, ssh_user: str = "ubuntu"
) -> Instance:
    tag_map = t.from_aws(raw.get("Tags"))
    public_ip = raw.get("PublicIpAddress")
    private_ip = raw.get("PrivateIpAddress")
    price = tag_map.get(t.PRICE)
    state = _STATES.get(raw.get("State", {}).get("Name", ""), "unknown")
    reason = raw.get("StateReason", {}).get("Code", "")
    ending = state in ("stopping", "terminated")
    reclaimed = ending and (reason == SPOT_RECLAIM or t.ENDED_BY_GPULAYER not in tag_map)
    return Instance(
        id=raw["InstanceId"],
        provider=PROVIDER,
        region=region,
        zone=raw.get("Placement", {}).get("AvailabilityZone"),
        state=state,
        instance_type=raw.get("InstanceType"),
        public_ip=public_ip,
        private_ip=private_ip,
        ssh_host=private_ip if use_private_ip else (public_ip or private_ip),
        ssh_user=tag_map.get(t.SSH_USER, ssh_user),
        ssh_port=22,
        host_key=None,
        hourly_price=float(price) if price else None,
        spot=raw.get("InstanceLifecycle") == "spot",
        tags=tag_map,
        launched_at=raw.get("LaunchTime"),
        reclaimed=reclaimed,
        install_root=tag_map.get(t.INSTALL_ROOT),
        python=tag_map.get(t.PYTHON),
    )


def raw_instances(ec2: Any, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
        for reservation in page.get("Reservations", []):
            found.extend(reservation.get("Instances", []))
    return found


def by_ids(ec2: Any, ids: Iterable[str]) -> list[dict[str, Any]]:
    """The instances among ``ids`` in the client's region. A filter rather than InstanceIds,
    because an id of another region (or a long-gone one) must not fail the whole call."""
    wanted = list(ids)
    found = []
    for start in range(0, len(wanted), 100):
        chunk = wanted[start : start + 100]
        found += raw_instances(ec2, [{"Name": "instance-id", "Values": chunk}])
    return found


def live_by_tags(ec2: Any, tag_map: Mapping[str, str]) -> list[dict[str, Any]]:
    filters = [*t.filters(tag_map), {"Name": "instance-state-name", "Values": NOT_TERMINATED}]
    return raw_instances(ec2, filters)


def security_group_ids(raw: Mapping[str, Any]) -> list[str]:
    """Groups of the instance, including those only on its network interfaces."""
    groups = {g["GroupId"] for g in raw.get("SecurityGroups", [])}
    for interface in raw.get("NetworkInterfaces", []):
        groups |= {g["GroupId"] for g in interface.get("Groups", [])}
    return sorted(groups)
