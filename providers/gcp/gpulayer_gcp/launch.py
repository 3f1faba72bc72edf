"""Start one GCE instance for a launch request, idempotently.

Per request: a firewall rule admitting SSH from the controller's network only, to a network
tag of this request, then the instance, both named after the request id and inserted with a
``requestId`` derived from it (GCE answers a repeated requestId with the first operation). A
retried launch finds the instance by its name and returns it. When the insert fails, the
firewall rule is deleted again.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any

from gpulayer.cloud import (
    ImageNotFoundError,
    Instance,
    LaunchRequest,
    Offer,
    ProviderError,
    ProviderSettingsError,
    ProvisionTimeout,
    launch_zone,
)
from gpulayer_gcp.catalog import PriceCatalog
from gpulayer_gcp.errors import PROVIDER, gcp_errors, is_conflict, is_not_found, operation_error
from gpulayer_gcp.instances import label_key, to_instance, to_labels
from gpulayer_gcp.offers import Machine, parse_instance_type
from gpulayer_gcp.session import Clients
from gpulayer_gcp.settings import GcpSettings, resource_name, zone_region

log = logging.getLogger(__name__)

# requestId must be a UUID; one derived from the request id and the call keeps retries
# idempotent across controller restarts.
_REQUEST_NAMESPACE = uuid.UUID("6f1c1e52-6a43-4c56-9a57-2b0f3f6d9b10")


def request_uuid(request_id: str, purpose: str) -> str:
    return str(uuid.uuid5(_REQUEST_NAMESPACE, f"{purpose}:{request_id}"))


def launch(
    clients: Clients,
    settings: GcpSettings,
    catalog: PriceCatalog,
    offer: Offer,
    request: LaunchRequest,
) -> Instance:
    region, zone = offer.region, launch_zone(offer, request, PROVIDER)
    machine = parse_instance_type(offer.instance_type, catalog)
    name = resource_name(request.request_id)
    project = clients.project
    with gcp_errors(region, zone):
        existing = _get(clients, project, zone, name)
    if existing is not None:
        return _instance(existing, settings)

    with gcp_errors(region, zone):
        source_image, ssh_user = _image_and_user(clients, settings, request)
        _ensure_firewall(clients, settings, project, name, request)
    from google.cloud import compute_v1

    try:
        with gcp_errors(region, zone):
            body = instance_body(
                settings, offer, machine, request, project, zone, source_image, ssh_user
            )
            operation = clients.instances().insert_unary(
                request=compute_v1.InsertInstanceRequest(
                    project=project,
                    zone=zone,
                    instance_resource=body,
                    request_id=request_uuid(request.request_id, "insert"),
                )
            )
            done = wait_zone(clients, settings, project, zone, operation)
        failure = operation_error(done, region=region, zone=zone, what="insert")
        if failure is not None:
            raise failure
        with gcp_errors(region, zone):
            raw = clients.instances().get(project=project, zone=zone, instance=name)
    except ProviderError:
        delete_firewall(clients, settings, project, name, best_effort=True)
        raise
    return _instance(raw, settings)


def node_name(request_id: str, node_rank: int) -> str:
    """Node 0 carries the request's own name (as a lone instance does); node k adds -nk."""
    base = resource_name(request_id)
    return base if node_rank == 0 else f"{base[:58].rstrip('-')}-n{node_rank}"


def launch_gang(
    clients: Clients,
    settings: GcpSettings,
    catalog: PriceCatalog,
    offer: Offer,
    request: LaunchRequest,
) -> list[Instance]:
    """A gang's ``request.count`` instances in one zone, all of them or none: each node is
    inserted with a requestId of its own (a retried launch gets the same operations, and
    finds nodes already made by name); when one cannot be had, the nodes made are deleted
    with the rule and the refusal is raised. The nodes share one network tag, which the
    request's one firewall rule targets: SSH from the controller, and the gang's own traffic
    (rendezvous, gloo, NCCL) from that tag; terminating node 0 deletes it, as for one."""
    region, zone = offer.region, launch_zone(offer, request, PROVIDER)
    machine = parse_instance_type(offer.instance_type, catalog)
    project = clients.project
    names = [node_name(request.request_id, rank) for rank in range(request.count)]
    with gcp_errors(region, zone):
        source_image, ssh_user = _image_and_user(clients, settings, request)
        _ensure_firewall(clients, settings, project, names[0], request, gang=True)
    from google.cloud import compute_v1

    made: list[str] = []
    try:
        for rank, name in enumerate(names):
            with gcp_errors(region, zone):
                if _get(clients, project, zone, name) is None:
                    body = instance_body(
                        settings,
                        offer,
                        machine,
                        request,
                        project,
                        zone,
                        source_image,
                        ssh_user,
                        node_rank=rank,
                    )
                    operation = clients.instances().insert_unary(
                        request=compute_v1.InsertInstanceRequest(
                            project=project,
                            zone=zone,
                            instance_resource=body,
                            request_id=request_uuid(request.request_id, f"insert:{rank}"),
                        )
                    )
                    made.append(name)
                    done = wait_zone(clients, settings, project, zone, operation)
                    failure = operation_error(done, region=region, zone=zone, what="insert")
                    if failure is not None:
                        raise failure
        with gcp_errors(region, zone):
            raws = [clients.instances().get(project=project, zone=zone, instance=n) for n in names]
    except ProviderError:
        _undo_gang(clients, settings, project, zone, made, request)
        raise
    return [_instance(raw, settings) for raw in raws]


def _undo_gang(
    clients: Clients,
    settings: GcpSettings,
    project: str,
    zone: str,
    names: list[str],
    request: LaunchRequest,
) -> None:
    """A gang that could not be had whole: the nodes made go, then its rules."""
    for name in names:
        try:
            with gcp_errors(zone_region(zone), zone):
                operation = clients.instances().delete_unary(
                    project=project, zone=zone, instance=name
                )
                wait_zone(clients, settings, project, zone, operation)
        except Exception as exc:
            if not is_not_found(exc):
                log.warning("gcp: could not delete node %s of a partial gang: %s", name, exc)
    delete_firewall(
        clients, settings, project, resource_name(request.request_id), best_effort=True
    )


def _instance(raw: Any, settings: GcpSettings) -> Instance:
    return to_instance(raw, use_private_ip=settings.use_private_ip, ssh_user=settings.ssh_user)


def _get(clients: Clients, project: str, zone: str, name: str) -> Any | None:
    try:
        return clients.instances().get(project=project, zone=zone, instance=name)
    except Exception as exc:
        if is_not_found(exc):
            return None
        raise


def _image_and_user(
    clients: Clients, settings: GcpSettings, request: LaunchRequest
) -> tuple[str, str]:
    """The image to boot (the settings' or the job's release) and the user it logs in as."""
    selector = dict(settings.image or request.image)
    if not selector:
        raise ProviderSettingsError(
            "image: no image in the gcp settings or the job's image release", provider=PROVIDER
        )
    return resolve_image(clients, selector), str(selector.get("ssh_user") or settings.ssh_user)


def resolve_image(clients: Clients, selector: Mapping[str, Any]) -> str:
    """The image link to boot: the selector's ``image``, or the newest of its family."""
    if selector.get("image"):
        return str(selector["image"])
    project, family = selector.get("project"), selector.get("family")
    if not project or not family:
        raise ProviderSettingsError("image: give project and family, or image", provider=PROVIDER)
    try:
        image = clients.images().get_from_family(project=str(project), family=str(family))
    except Exception as exc:
        if is_not_found(exc):
            raise ImageNotFoundError(
                f"no image of family {family!r} in project {project!r}", provider=PROVIDER
            ) from exc
        raise
    return str(image.self_link or f"projects/{project}/global/images/{image.name}")


def _network_link(project: str, network: str) -> str:
    return network if "/" in network else f"projects/{project}/global/networks/{network}"


def _ensure_firewall(
    clients: Clients,
    settings: GcpSettings,
    project: str,
    name: str,
    request: LaunchRequest,
    *,
    gang: bool = False,
) -> None:
    from google.cloud import compute_v1

    rule = compute_v1.Firewall(
        name=name,
        description=f"gpulayer job {request.job_id}: SSH from the controller only",
        network=_network_link(project, settings.network),
        direction="INGRESS",
        priority=1000,
        source_ranges=[request.allowed_ssh_cidr],
        target_tags=[name],
        allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["22"])],
    )
    if gang:
        # A rule matches a source in its ranges or its tags; its ports are the rendezvous,
        # gloo and NCCL ones, which torchrun picks, so every TCP port.
        rule.description = f"gpulayer job {request.job_id}: the controller and its gang's nodes"
        rule.source_tags = [name]
        rule.allowed = [compute_v1.Allowed(I_p_protocol="tcp")]
    try:
        operation = clients.firewalls().insert_unary(
            request=compute_v1.InsertFirewallRequest(
                project=project,
                firewall_resource=rule,
                request_id=request_uuid(request.request_id, "firewall"),
            )
        )
    except Exception as exc:
        if is_conflict(exc):
            return  # a retried launch: the rule is there already
        raise
    done = wait_global(clients, settings, project, operation)
    failure = operation_error(done, region=None, zone=None, what="firewall insert")
    if failure is not None:
        raise failure


def delete_firewall(
    clients: Clients, settings: GcpSettings, project: str, name: str, *, best_effort: bool
) -> None:
    """Delete the request's firewall rule; gone already is fine."""
    try:
        with gcp_errors():
            try:
                operation = clients.firewalls().delete_unary(project=project, firewall=name)
            except Exception as exc:
                if is_not_found(exc):
                    return
                raise
            done = wait_global(clients, settings, project, operation)
        failure = operation_error(done, region=None, zone=None, what="firewall delete")
        if failure is not None:
            raise failure
    except ProviderError as exc:
        if not best_effort:
            raise
        log.warning("gcp: could not delete firewall rule %s of a failed launch: %s", name, exc)


def instance_body(
    settings: GcpSettings,
    offer: Offer,
    machine: Machine,
    request: LaunchRequest,
    project: str,
    zone: str,
    source_image: str,
    ssh_user: str,
    *,
    node_rank: int = 0,
) -> Any:
    from google.cloud import compute_v1

    tag = resource_name(request.request_id)
    name = node_name(request.request_id, node_rank)
    labels = to_labels(
        {
            **request.tags,
            "gpulayer:owner": request.owner,
            "gpulayer:job": request.job_id,
            "gpulayer:request": request.request_id,
        }
    )
    metadata = _instance_metadata(settings, offer, request, ssh_user)
    interface = _network_interface(settings, offer, request, project, node_rank)
    disk_params = compute_v1.AttachedDiskInitializeParams(
        source_image=source_image,
        disk_type=f"zones/{zone}/diskTypes/{settings.disk_type}",
    )
    if request.disk_gb is not None:
        disk_params.disk_size_gb = request.disk_gb
    has_gpus = machine.count > 0
    scheduling = compute_v1.Scheduling(
        # GPUs cannot live-migrate, and spot capacity is never migrated either.
        on_host_maintenance="TERMINATE" if has_gpus or offer.spot else "MIGRATE",
        automatic_restart=not (has_gpus or offer.spot),
    )
    if offer.spot:
        scheduling.provisioning_model = "SPOT"
        scheduling.instance_termination_action = "DELETE"
    body = compute_v1.Instance(
        name=name,
        machine_type=f"zones/{zone}/machineTypes/{machine.machine_type}",
        labels=labels,
        tags=compute_v1.Tags(items=[tag]),
        metadata=compute_v1.Metadata(
            items=[compute_v1.Items(key=k, value=v) for k, v in metadata.items()]
        ),
        disks=[
            compute_v1.AttachedDisk(
                boot=True, auto_delete=True, type_="PERSISTENT", initialize_params=disk_params
            )
        ],
        network_interfaces=[interface],
        scheduling=scheduling,
    )
    if machine.attached and machine.accelerator:
        body.guest_accelerators = [
            compute_v1.AcceleratorConfig(
                accelerator_type=f"zones/{zone}/acceleratorTypes/{machine.accelerator}",
                accelerator_count=machine.count,
            )
        ]
    return body


# instance_body's parts, each a function so the body reads as the instance it describes.


def _instance_metadata(
    settings: GcpSettings, offer: Offer, request: LaunchRequest, ssh_user: str
) -> dict[str, str]:
    """The instance's metadata: the login key, and what gpulayer reads back from it later."""
    metadata = {
        "ssh-keys": f"{ssh_user}:{request.ssh_public_key.strip()}",
        # Only the request's key logs in, not the project's keys.
        "block-project-ssh-keys": "true",
        label_key("gpulayer:ssh-user"): ssh_user,
        label_key("gpulayer:instance-type"): offer.instance_type,
    }
    if offer.hourly_price is not None:
        metadata[label_key("gpulayer:hourly-price")] = f"{offer.hourly_price:g}"
    if settings.python is not None:
        metadata[label_key("gpulayer:python")] = settings.python
    if settings.install_root is not None:
        metadata[label_key("gpulayer:install-root")] = settings.install_root
    return metadata


def _network_interface(
    settings: GcpSettings, offer: Offer, request: LaunchRequest, project: str, node_rank: int
) -> Any:
    """The instance's one network interface: its network, subnetwork, fixed address (the
    first node only) and, unless private addresses are asked for, an external address."""
    from google.cloud import compute_v1

    interface = compute_v1.NetworkInterface(network=_network_link(project, settings.network))
    if settings.subnetwork:
        subnetwork = settings.subnetwork
        if "/" not in subnetwork:
            subnetwork = f"regions/{offer.region}/subnetworks/{subnetwork}"
        interface.subnetwork = subnetwork
    if request.private_ip and node_rank == 0:
        interface.network_i_p = request.private_ip
    if not settings.use_private_ip:
        interface.access_configs = [
            compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")
        ]
    return interface


def _wait(settings: GcpSettings, operation: Any, wait_once: Any, what: str) -> Any:
    deadline = time.monotonic() + settings.operation_timeout_seconds
    current = operation
    while not _done(current):
        if time.monotonic() > deadline:
            raise ProvisionTimeout(
                f"{what} {operation.name} not done after {settings.operation_timeout_seconds:g} s",
                provider=PROVIDER,
            )
        # wait answers when the operation is done or after about two minutes, whichever
        # comes first: no polling interval to choose.
        current = wait_once(operation.name)
    return current


def _done(operation: Any) -> bool:
    # Operation.status is an enum of the client (Status.DONE), not a string.
    status = operation.status
    return str(getattr(status, "name", status)) == "DONE"


def wait_zone(
    clients: Clients, settings: GcpSettings, project: str, zone: str, operation: Any
) -> Any:
    operations = clients.zone_operations()
    return _wait(
        settings,
        operation,
        lambda op: operations.wait(project=project, zone=zone, operation=op),
        "operation",
    )


def wait_global(clients: Clients, settings: GcpSettings, project: str, operation: Any) -> Any:
    operations = clients.global_operations()
    return _wait(
        settings,
        operation,
        lambda op: operations.wait(project=project, operation=op),
        "operation",
    )
