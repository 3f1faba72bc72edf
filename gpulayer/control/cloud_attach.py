"""A control plane's cloud side: providers from providers.yaml, the lifecycle reconciler."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpulayer.cloud.lifecycle.reconciler import Reconciler
from gpulayer.errors import SpecError, UsageError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpulayer.cloud.job_machines import JobMachines
    from gpulayer.cloud.lifecycle.ports import InstanceStore, JobPort
    from gpulayer.cloud.lifecycle.records import InstanceRecord
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


class ProviderCloud:
    """The control plane's cloud side: providers from providers.yaml (one registry: a provider
    is built once per settings change) and, once started, the lifecycle reconciler that rents
    and ends machines for cloud jobs. A :class:`CloudGate` for the control plane."""

    def __init__(self, root: Path, store: InstanceStore) -> None:
        from gpulayer.cloud.provider_registry import ProviderRegistry

        self.root = root
        self.store = store
        self.registry = ProviderRegistry(root)
        self.lifecycle: Reconciler | None = None
        self._machines: JobMachines | None = None

    def available(self) -> bool:
        return bool(self.registry.checked().providers)

    def refusal(self, spec: JobSpec) -> str | None:
        from gpulayer.cloud.lifecycle.gangs import nodes_of
        from gpulayer.cloud.lifecycle.placement import catalog_refusal, gang_refusal
        from gpulayer.cloud.search import check_gpu_models

        try:  # as `offers` refuses it: a name no offer can have is the user's mistake
            check_gpu_models(spec.resources.gpu_models, "resources.gpu_models")
        except UsageError as exc:
            raise SpecError([str(exc)]) from None
        chosen = self.registry.enabled(tuple(spec.placement.providers))
        if nodes_of(spec) > 1:
            return gang_refusal(
                spec,
                chosen,
                self.store.list_instances(live_only=True),
                wait_seconds=self.registry.orchestrator()["cloud_wait_seconds"],
            )
        return catalog_refusal(spec, chosen)

    def plan(self, spec: JobSpec) -> dict[str, Any]:
        from gpulayer.cloud.lifecycle.gangs import nodes_of
        from gpulayer.cloud.search import plan_cloud

        chosen = self.registry.enabled(tuple(spec.placement.providers))
        wait = self.registry.orchestrator()["cloud_wait_seconds"]
        return plan_cloud(spec, chosen, nodes=nodes_of(spec), wait_seconds=wait)

    def silence_excused(self) -> set[str]:
        return self.lifecycle.reconnecting_workers() if self.lifecycle is not None else set()

    def idle_seconds(self, provider: str) -> float:
        from gpulayer.errors import GpulayerError

        try:
            return self.registry.checked().idle_seconds_of(provider)
        except GpulayerError:  # an invalid file keeps nothing warm (the lifecycle reads 0)
            return 0.0

    def idle_limits(self, records: Sequence[InstanceRecord]) -> dict[str, float | None]:
        from gpulayer.cloud.fleets import Machine, idle_limits
        from gpulayer.errors import GpulayerError

        try:
            rules = self.registry.checked().fleet_rules()
        except GpulayerError:
            rules = []
        providers = {r.request_id: r.provider for r in records}
        machines = [
            Machine(r.request_id, r.fleet, r.state, r.state_since or r.created_at) for r in records
        ]
        return idle_limits(machines, rules, lambda key: self.idle_seconds(providers[key]))

    def reap(self, *, dry_run: bool) -> list[dict[str, Any]] | None:
        if self.lifecycle is None:
            return None
        return list(self.lifecycle.reap(dry_run=dry_run))

    def forward_port(self, record: InstanceRecord, port: int, live: set[str]) -> int:
        machines = self._job_machines()
        machines.keep_only(live)
        return machines.forward(record, port)

    def run_in_job(
        self, record: InstanceRecord, job_id: str, argv: list[str], timeout: float
    ) -> tuple[int, str, str]:
        return self._job_machines().run(record, job_id, argv, timeout)

    def _job_machines(self) -> JobMachines:
        if self._machines is None:
            from gpulayer.cloud.job_machines import JobMachines

            self._machines = JobMachines(self.root / "keys")
        return self._machines

    def start_lifecycle(self, port: JobPort, control_port: int) -> Reconciler:
        """The reconciler, driving the control plane's cloud jobs through ``port``."""
        self.lifecycle = Reconciler(
            port,
            control_port=control_port,
            owner=owner_id(self.root),
            load_providers=self.registry.enabled,
            settings=self.registry.orchestrator,
            parallel_launches=_parallel_launches(self.root),
        )
        self.lifecycle.start()
        return self.lifecycle
