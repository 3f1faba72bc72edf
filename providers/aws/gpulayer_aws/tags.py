"""The tags gpulayer puts on what it creates, and EC2's tag list form."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

OWNER = "gpulayer:owner"
JOB = "gpulayer:job"
REQUEST = "gpulayer:request"
PRICE = "gpulayer:hourly-price"
SSH_USER = "gpulayer:ssh-user"
# Read by the orchestrator's bootstrap from the instance it is handed.
PYTHON = "gpulayer:python"
INSTALL_ROOT = "gpulayer:install-root"
# Put on an instance just before gpulayer terminates it, so an instance that ended without it
# was ended by someone else (a spot reclaim, a person in the console).
ENDED_BY_GPULAYER = "gpulayer:ended-by-gpulayer"


def resource_name(request_id: str) -> str:
    """Key pairs and security groups are named after the launch request they serve."""
    return f"gpulayer-{request_id}"


def to_aws(tags: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def from_aws(tags: Iterable[Mapping[str, Any]] | None) -> dict[str, str]:
    return {str(t["Key"]): str(t.get("Value", "")) for t in tags or ()}


def specs(resource_types: Iterable[str], tags: Mapping[str, str]) -> list[dict[str, Any]]:
    return [{"ResourceType": rt, "Tags": to_aws(tags)} for rt in resource_types]


def filters(tags: Mapping[str, str]) -> list[dict[str, Any]]:
    return [{"Name": f"tag:{k}", "Values": [v]} for k, v in tags.items()]
