"""End instances and their request's firewall rule, idempotently; tell preempted ones apart.

The firewall rule of a request carries the instance's own name (both are named after the
request id), so nothing gpulayer did not create for that request is touched.
"""

from __future__ import annotations

from gpulayer_gcp.errors import gcp_errors, is_not_found, operation_error
from gpulayer_gcp.instances import last_part, split_id
from gpulayer_gcp.launch import delete_firewall, request_uuid, wait_zone
from gpulayer_gcp.session import Clients
from gpulayer_gcp.settings import GcpSettings, zone_region

PREEMPTED = "compute.instances.preempted"


def terminate_one(clients: Clients, settings: GcpSettings, value: str) -> None:
    """Delete the instance ``ZONE/NAME`` and wait until it is gone, then its firewall rule."""
    from google.cloud import compute_v1

    zone, name = split_id(value)
    region = zone_region(zone)
    project = clients.project
    with gcp_errors(region, zone):
        try:
            operation = clients.instances().delete_unary(
                request=compute_v1.DeleteInstanceRequest(
                    project=project,
                    zone=zone,
                    instance=name,
                    request_id=request_uuid(name, "delete"),
                )
            )
        except Exception as exc:
            if not is_not_found(exc):
                raise
            operation = None
        if operation is not None:
            done = wait_zone(clients, settings, project, zone, operation)
            failure = operation_error(done, region=region, zone=zone, what="delete")
            if failure is not None and not _gone(failure):
                raise failure
    delete_firewall(clients, settings, project, name, best_effort=False)


def _gone(failure: Exception) -> bool:
    return "RESOURCE_NOT_FOUND" in str(failure)


def was_preempted(clients: Clients, zone: str, name: str) -> bool:
    """Whether GCE preempted the instance: a zone operation of type preempted names it."""
    from google.cloud import compute_v1

    with gcp_errors(zone_region(zone), zone):
        listed = clients.zone_operations().list(
            request=compute_v1.ListZoneOperationsRequest(
                project=clients.project, zone=zone, filter=f'operationType = "{PREEMPTED}"'
            )
        )
        return any(
            str(op.operation_type) == PREEMPTED and last_part(str(op.target_link)) == name
            for op in listed
        )
