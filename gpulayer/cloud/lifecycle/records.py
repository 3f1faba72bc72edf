"""What the lifecycle remembers of each instance: one record per try of an offer, kept as the
ledger after the machine is gone. The store persists it; the lifecycle owns its shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpulayer.cloud.lifecycle.states import GONE

if TYPE_CHECKING:
    from gpulayer.cloud.lifecycle.step_result import StepResult

INSTANCE_GONE_STATES = GONE
"""The states in which nothing is left in the cloud."""


@dataclass
class InstanceRecord:
    request_id: str
    job_id: str
    """The job it is (or was last) the machine of; "" for a fleet's machine no job has taken
    yet (NULL in the store)."""
    owner: str
    provider: str
    region: str | None
    zone: str | None
    instance_type: str | None
    instance_id: str | None
    state: str
    ssh_host: str | None
    key_path: str | None
    hourly_price: float | None
    currency: str
    spot: bool
    tags: dict[str, str]
    created_at: float
    launched_at: float | None
    ready_at: float | None
    ended_at: float | None
    note: str | None
    offer: dict[str, Any] | None = None
    state_since: float | None = None
    tunnel_port: int | None = None
    token_hash: str | None = None
    install_dir: str | None = None
    machine: dict[str, Any] | None = None
    """The provider's instance as launch returned it (address, login user, tags)."""
    launch_id: str | None = None
    """The request id the instances of one gang were launched under (node 0's); None alone."""
    node_rank: int = 0

    outcome: str | None = None
    """What this try ended in (capacity, quota, auth, config, failed, partial, reclaimed);
    None while it runs or when it ended without a fault."""
    outcome_scope: str | None = None
    """How far a refusal reaches: offer, zone, region or provider."""
    outcome_message: str | None = None
    hold_until: float | None = None
    """A reclaimed machine's offer is held for every job until then."""
    last_error: str | None = None
    """The last failure of a later step (a terminate), kept apart from the outcome."""
    step_failures: int = 0
    next_step_at: float | None = None
    """When the step that failed is tried again."""
    unreachable_since: float | None = None
    checked_at: float | None = None
    """When the provider was last asked whether its running machine is still there."""
    reclaimed_at: float | None = None
    """When its reclaim was first seen while its job still saved its work."""
    last_step: str | None = None
    """The last step that ran for it (launch, prepare, reconnect, check, drain, terminate)."""
    last_step_result: str | None = None
    """What that step found, as stored (JSON; see :attr:`step_result`)."""
    step_at: float | None = None
    relink_since: float | None = None
    """Set by a restarted controller: its worker's tunnel is to be reopened, so the worker's
    silence until then is the controller's, not the worker's."""
    fleet: str | None = None
    """The named fleet (providers.yaml's ``fleets:``) the machine belongs to, if any."""

    @property
    def step_result(self) -> StepResult | None:
        from gpulayer.cloud.lifecycle.step_result import StepResult

        return StepResult.from_json(self.last_step_result)

    @property
    def gone(self) -> bool:
        return self.state in GONE

    def cost(self, now: float) -> float | None:
        """Accrued cost: the hourly price from launch to end (or now)."""
        if self.hourly_price is None or self.launched_at is None:
            return None if self.hourly_price is None else 0.0
        end = self.ended_at if self.ended_at is not None else now
        return self.hourly_price * max(0.0, end - self.launched_at) / 3600.0
