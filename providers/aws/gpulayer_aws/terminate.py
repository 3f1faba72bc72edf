"""End instances and what was created for them (key pair, security group), idempotently.

Key pair and security group belong to one launch request; they are found through the
instance's request tag, and a group is only deleted when it carries the same request tag, so
nothing gpulayer did not create for that request is touched.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from gpulayer.cloud import ProvisionTimeout
from gpulayer_aws import tags as t
from gpulayer_aws.errors import PROVIDER, aws_errors, error_code
from gpulayer_aws.instances import security_group_ids
from gpulayer_aws.settings import AwsSettings

log = logging.getLogger(__name__)

_GONE = frozenset({"InvalidInstanceID.NotFound", "InvalidKeyPair.NotFound"})
_GROUP_GONE = frozenset({"InvalidGroup.NotFound", "InvalidGroupId.NotFound"})


def terminate_in_region(
    ec2: Any,
    settings: AwsSettings,
    region: str,
    raws: list[dict[str, Any]],
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Terminate the described instances of one region, wait until they are gone, then delete
    their request's key pair and security group."""
    ids = [r["InstanceId"] for r in raws if r.get("State", {}).get("Name") != "terminated"]
    with aws_errors(region):
        if ids:
            # Recorded on the instance before the call: whoever describes it later can tell
            # our terminate from the provider taking the instance back.
            try:
                ec2.create_tags(Resources=ids, Tags=[{"Key": t.ENDED_BY_GPULAYER, "Value": "true"}])
            except Exception as exc:
                if error_code(exc) not in _GONE:
                    raise
            try:
                ec2.terminate_instances(InstanceIds=ids)
            except Exception as exc:
                if error_code(exc) not in _GONE:
                    raise
        all_ids = [r["InstanceId"] for r in raws]
        if all_ids:
            _wait_terminated(ec2, settings, all_ids)
    for raw in raws:
        request_id = t.from_aws(raw.get("Tags")).get(t.REQUEST)
        if request_id:
            _delete_request_resources(ec2, settings, region, raw, request_id, sleep)


def _wait_terminated(ec2: Any, settings: AwsSettings, ids: list[str]) -> None:
    from botocore.exceptions import WaiterError

    delay = settings.poll_seconds
    attempts = max(1, int(settings.terminate_timeout_seconds / delay) + 1)
    try:
        ec2.get_waiter("instance_terminated").wait(
            InstanceIds=ids, WaiterConfig={"Delay": delay, "MaxAttempts": attempts}
        )
    except WaiterError as exc:
        last = exc.last_response or {}
        code = last.get("Error", {}).get("Code")
        if code in _GONE:
            return
        if code:
            raise
        raise ProvisionTimeout(
            f"instances {', '.join(ids)} not terminated after "
            f"{settings.terminate_timeout_seconds:g} s",
            provider=PROVIDER,
        ) from exc


def _delete_request_resources(
    ec2: Any,
    settings: AwsSettings,
    region: str,
    raw: dict[str, Any],
    request_id: str,
    sleep: Callable[[float], None],
) -> None:
    name = t.resource_name(request_id)
    with aws_errors(region):
        for group_id in _request_groups(ec2, raw, request_id):
            _delete_group(ec2, settings, group_id, sleep)
        if raw.get("KeyName") == name:
            try:
                ec2.delete_key_pair(KeyName=name)
            except Exception as exc:
                if error_code(exc) not in _GONE:
                    raise


def _request_groups(ec2: Any, raw: dict[str, Any], request_id: str) -> list[str]:
    candidates = security_group_ids(raw)
    if not candidates:
        return []
    try:
        groups = ec2.describe_security_groups(
            Filters=[
                {"Name": "group-id", "Values": candidates},
                {"Name": f"tag:{t.REQUEST}", "Values": [request_id]},
            ]
        )["SecurityGroups"]
    except Exception as exc:
        if error_code(exc) in _GROUP_GONE:
            return []
        raise
    return [g["GroupId"] for g in groups]


def _delete_group(
    ec2: Any, settings: AwsSettings, group_id: str, sleep: Callable[[float], None]
) -> None:
    # A terminated instance's network interface can hold on to the group for a little while.
    from gpulayer.cloud import CLOUD_RESOURCE_RELEASE  # tenacity, only once it is needed

    def still_in_use(exc: BaseException) -> bool:
        return error_code(exc) == "DependencyViolation"

    def note(state: object) -> None:
        log.info("aws: security group %s still in use; retrying", group_id)

    retrying = CLOUD_RESOURCE_RELEASE.retrying(
        retry_if=still_in_use,
        give_up_after=settings.terminate_timeout_seconds,
        before_sleep=note,
        sleep=sleep,
    )
    for attempt in retrying:
        with attempt:
            try:
                ec2.delete_security_group(GroupId=group_id)
            except Exception as exc:
                if error_code(exc) not in _GROUP_GONE:
                    raise
