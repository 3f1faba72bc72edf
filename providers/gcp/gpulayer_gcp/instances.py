"""GCE instances as gpulayer Instances; the labels and metadata gpulayer puts on them.

gpulayer's tags (``gpulayer:owner``, ...) become labels (``gpulayer-owner``): label keys and
values allow only lower-case letters, digits, ``_`` and ``-``. What does not fit a label (the
python path, the install root, the price) goes into the instance's metadata.

An instance's gpulayer id is ``ZONE/NAME``: GCE names instances per zone, and the id alone then
says where to look, after a controller restart too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from gpulayer.cloud import Instance, InstanceState
from gpulayer_gcp.errors import PROVIDER
from gpulayer_gcp.settings import zone_region

TAG_PREFIX = "gpulayer:"
LABEL_PREFIX = "gpulayer-"
# Tags carried in metadata, read back by the orchestrator from the Instance.
METADATA_TAGS = (
    "gpulayer:python",
    "gpulayer:install-root",
    "gpulayer:ssh-user",
    "gpulayer:hourly-price",
    "gpulayer:instance-type",
)

_STATES: dict[str, InstanceState] = {
    "PROVISIONING": "pending",
    "STAGING": "pending",
    "RUNNING": "running",
    "STOPPING": "stopping",
    "SUSPENDING": "stopping",
    "SUSPENDED": "stopping",
    "REPAIRING": "stopping",
    # A stopped instance still exists (and its disk is billed) until it is deleted.
    "TERMINATED": "stopping",
}
_LABEL_RE = re.compile(r"[^a-z0-9_-]+")


def label_key(tag: str) -> str:
    key = LABEL_PREFIX + tag[len(TAG_PREFIX) :] if tag.startswith(TAG_PREFIX) else tag
    return (_LABEL_RE.sub("-", key.lower()) or "x")[:63]


def label_value(value: str) -> str:
    return _LABEL_RE.sub("-", value.lower())[:63]


def to_labels(tags: Mapping[str, str]) -> dict[str, str]:
    return {label_key(k): label_value(v) for k, v in tags.items()}


def label_filter(tags: Mapping[str, str]) -> str:
    """An aggregated-list filter matching every tag: labels.gpulayer-job = "j-..." AND ..."""
    return " AND ".join(f'(labels.{k} = "{v}")' for k, v in sorted(to_labels(tags).items()))


def from_labels(labels: Mapping[str, str]) -> dict[str, str]:
    return {
        (TAG_PREFIX + k[len(LABEL_PREFIX) :] if k.startswith(LABEL_PREFIX) else k): v
        for k, v in labels.items()
    }


def metadata_items(raw: Any) -> dict[str, str]:
    metadata = getattr(raw, "metadata", None)
    items = getattr(metadata, "items", None) or []
    return {str(i.key): str(i.value) for i in items}


def instance_id(zone: str, name: str) -> str:
    return f"{zone}/{name}"


def split_id(value: str) -> tuple[str, str]:
    zone, _, name = value.partition("/")
    if not zone or not name:
        raise ValueError(f"{value!r} is not a GCE instance id of the form ZONE/NAME")
    zone_region(zone)
    return zone, name


def last_part(link: str) -> str:
    return link.rstrip("/").rsplit("/", 1)[-1]


def to_instance(raw: Any, *, use_private_ip: bool, ssh_user: str) -> Instance:
    zone = last_part(str(raw.zone))
    tags = from_labels(dict(raw.labels))
    metadata = metadata_items(raw)
    for tag in METADATA_TAGS:
        key = label_key(tag)
        if key in metadata:
            tags[tag] = metadata[key]
    interfaces = list(raw.network_interfaces)
    private_ip = interfaces[0].network_i_p if interfaces else None
    public_ip = None
    if interfaces and interfaces[0].access_configs:
        public_ip = interfaces[0].access_configs[0].nat_i_p or None
    price = tags.get("gpulayer:hourly-price")
    scheduling = raw.scheduling
    return Instance(
        id=instance_id(zone, raw.name),
        provider=PROVIDER,
        region=zone_region(zone),
        zone=zone,
        state=_STATES.get(str(raw.status), "unknown"),
        instance_type=tags.get("gpulayer:instance-type") or last_part(str(raw.machine_type)),
        public_ip=public_ip,
        private_ip=private_ip or None,
        ssh_host=(private_ip if use_private_ip else (public_ip or private_ip)) or None,
        ssh_user=tags.get("gpulayer:ssh-user", ssh_user),
        ssh_port=22,
        host_key=None,
        hourly_price=float(price) if price else None,
        spot=str(scheduling.provisioning_model) == "SPOT",
        tags=tags,
        launched_at=_timestamp(str(raw.creation_timestamp or "")),
        install_root=tags.get("gpulayer:install-root"),
        python=tags.get("gpulayer:python"),
    )


def _timestamp(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text) if text else None
    except ValueError:
        return None


def gone_instance(value: str, *, preempted: bool, ssh_user: str) -> Instance:
    """An instance GCE no longer has: deleted by us, or by GCE on preemption."""
    zone, _ = split_id(value)
    return Instance(
        id=value,
        provider=PROVIDER,
        region=zone_region(zone),
        zone=zone,
        state="terminated",
        ssh_user=ssh_user,
        spot=preempted,
        reclaimed=preempted,
    )
