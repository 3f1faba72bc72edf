"""What the control plane asks of its cloud side at submit and plan, and of the machines'
lifecycle while it runs: typed, and given to the control plane when it is built. A control
plane without providers has :class:`NoCloud`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpulayer.cloud.lifecycle.records import InstanceRecord
    from gpulayer.spec import JobSpec


class CloudGate(Protocol):
    def available(self) -> bool:
        """Whether any provider is set up (reading providers.yaml: a ConfigError, exit 2,
        refuses the job before anything is kept)."""
        ...

    def refusal(self, spec: JobSpec) -> str | None:
        """Why no offer could ever take the job, known at submit; None: it may run."""
        ...

    def plan(self, spec: JobSpec) -> dict[str, Any]:
        """The offers a plan of the job shows (see gpulayer.cloud.search)."""
        ...

    def silence_excused(self) -> set[str]:
        """Workers whose silence is the control plane's own (their tunnel is being reopened)."""
        ...

    def idle_seconds(self, provider: str) -> float:
        """How long the provider's machines stay warm after their job (0: not at all)."""
        ...

    def idle_limits(self, records: Sequence[InstanceRecord]) -> dict[str, float | None]:
        """Each record's idle limit as the lifecycle reads it (request id -> seconds; None: a
        fleet's machine kept within its min_nodes)."""
        ...

    def reap(self, *, dry_run: bool) -> list[dict[str, Any]] | None:
        """Machines tagged as this controller's that no record explains, ended (None: no
        lifecycle runs here)."""
        ...

    def forward_port(self, record: InstanceRecord, port: int, live: set[str]) -> int:
        """The port of this machine's loopback reaching ``port`` of ``record``'s machine;
        forwards to machines not in ``live`` (request ids) are closed."""
        ...

    def run_in_job(
        self, record: InstanceRecord, job_id: str, argv: list[str], timeout: float
    ) -> tuple[int, str, str]:
        """``argv`` run on ``record``'s machine as job ``job_id`` runs: (code, stdout, stderr)."""
        ...


class NoCloud:
    """No provider and no lifecycle: cloud targets are skipped as unavailable."""

    def available(self) -> bool:
        return False

    def refusal(self, spec: JobSpec) -> str | None:
        return None

    def plan(self, spec: JobSpec) -> dict[str, Any]:
        raise RuntimeError("no cloud is set up here")  # plan() asks only when available()

    def silence_excused(self) -> set[str]:
        return set()

    def idle_seconds(self, provider: str) -> float:
        return 0.0

    def idle_limits(self, records: Sequence[InstanceRecord]) -> dict[str, float | None]:
        return {r.request_id: 0.0 for r in records}

    def reap(self, *, dry_run: bool) -> list[dict[str, Any]] | None:
        return None

    def forward_port(self, record: InstanceRecord, port: int, live: set[str]) -> int:
        from gpulayer.errors import UsageError

        raise UsageError("attach: no cloud is set up on this control plane")

    def run_in_job(
        self, record: InstanceRecord, job_id: str, argv: list[str], timeout: float
    ) -> tuple[int, str, str]:
        from gpulayer.errors import UsageError

        raise UsageError("exec: no cloud is set up on this control plane")
