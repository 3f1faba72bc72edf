"""Wiring a control plane to its cloud side: providers from providers.yaml, the reconciler."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpulayer.cloud.lifecycle.reconciler import Reconciler

if TYPE_CHECKING:
    from gpulayer.control.service import ControlService
    from gpulayer.spec import JobSpec


def owner_id(root: Path) -> str:
    """This controller's identity in instance tags, stable across restarts."""
    from gpulayer.ids import new_id

    path = root / "owner-id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    owner = new_id("o", 12)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(owner + "\n")
    try:
        os.link(tmp, path)
    except FileExistsError:
        owner = path.read_text().strip()
    tmp.unlink(missing_ok=True)
    return owner


def _parallel_launches(root: Path) -> int:
    """The launch threads providers.yaml asks for; its default where the file is not valid
    yet (the control plane still starts, and names the problem on first use)."""
    from gpulayer.cloud.config import orchestrator_settings
    from gpulayer.cloud.orchestrator_settings import OrchestratorSettings
    from gpulayer.errors import GpulayerError

    try:
        return int(orchestrator_settings(root)["parallel_launches"])
    except GpulayerError:
        return int(OrchestratorSettings().parallel_launches)


def attach_lifecycle(service: ControlService, control_port: int) -> Reconciler:
    from gpulayer.cloud.provider_registry import ProviderRegistry

    root = service.layout.root
    # One registry for the control plane: a provider is built once per settings change.
    registry = ProviderRegistry(root)
    reconciler = Reconciler(
        service,
        control_port=control_port,
        owner=owner_id(root),
        load_providers=registry.enabled,
        settings=registry.orchestrator,
        parallel_launches=_parallel_launches(root),
    )
    service.cloud_available = lambda: bool(registry.checked().providers)

    def cloud_refusal(spec: JobSpec) -> str | None:
        from gpulayer.cloud.lifecycle.gangs import nodes_of
        from gpulayer.cloud.lifecycle.placement import cap_refusal, gang_refusal

        chosen = registry.enabled(tuple(spec.placement.providers))
        if nodes_of(spec) > 1:
            return gang_refusal(
                spec,
                chosen,
                service.store.list_instances(live_only=True),
                wait_seconds=registry.orchestrator()["cloud_wait_seconds"],
            )
        return cap_refusal(spec, chosen)

    service.cloud_refusal = cloud_refusal

    def cloud_plan(spec: JobSpec) -> dict[str, Any]:
        from gpulayer.cloud.lifecycle.gangs import nodes_of
        from gpulayer.cloud.search import plan_cloud

        chosen = registry.enabled(tuple(spec.placement.providers))
        wait = registry.orchestrator()["cloud_wait_seconds"]
        return plan_cloud(spec, chosen, nodes=nodes_of(spec), wait_seconds=wait)

    service.cloud_plan = cloud_plan
    service.provisioner = reconciler
    service.sweep_exempt = reconciler.reconnecting_workers
    reconciler.start()
    return reconciler
