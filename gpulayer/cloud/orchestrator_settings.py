"""The orchestrator's own settings: the ``gpulayer:`` section of providers.yaml."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator

from gpulayer.cloud.lifecycle.states import MAX_IDLE_SECONDS

IdleSeconds = Annotated[float, Strict(), Field(ge=0, le=MAX_IDLE_SECONDS)]
"""Type of an ``idle_seconds`` setting (the ``gpulayer:`` section's and each provider's)."""


class OrchestratorSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    ssh_cidr: str | None = None
    """Who may reach SSH on rented instances (a CIDR such as 203.0.113.7/32); None: this
    controller's public address as an echo service sees it, else its primary local one."""
    deadman_seconds: Annotated[float, Strict(), Field(gt=0)] = 600
    """How long a rented machine's worker goes without reaching the control plane before it
    ends its job and acts (powers its instance off, or stops on ssh hosts)."""
    deadman_action: str | None = None
    """What a worker does when the dead-man switch fires: poweroff, stop, or record:PATH (a
    file written instead, for tests); None: poweroff on cloud instances, stop on ssh hosts and
    Slurm nodes.
    GPULAYER_DEADMAN_ACTION overrides it."""
    system_site_packages: bool = False
    """Let jobs on rented machines see the packages their python has system-wide (an image's
    preinstalled torch, say), besides the worker's own."""
    hold_reclaimed_seconds: Annotated[float, Strict(), Field(ge=0)] = 600
    """How long an offer whose instance the provider reclaimed (a spot reclaim, a Slurm
    preemption) is held back before a retried job may rent it again."""
    cloud_wait_seconds: Annotated[float, Strict(), Field(gt=0, le=240)] = 30
    """How long a search for offers waits for a provider's API (all providers are asked at
    once) before it gives that provider up with a one-line reason: `gpulayer offers` and
    `gpulayer plan` then list its catalog instead, and a job's placement goes on without its
    offers (ending with that reason when no other provider has any). `gpulayer catalog
    refresh` gives each request to a price source this long. At most 240, so the CLI's own
    wait for the control plane outlasts it."""
    parallel_launches: Annotated[int, Strict(), Field(ge=1, le=64)] = 8
    """How many launches run at once. A launch may wait long inside its provider (a Slurm
    allocation pending in the queue); more launches than this wait for one to end. Read when
    the control plane starts."""
    state_timeouts: dict[str, Annotated[float, Field(gt=0, le=30 * 86400)]] = Field(
        default_factory=dict
    )
    """Seconds a rented instance may stay in a state before it is moved on with the reason
    recorded, per state: requested (60; not counted while its launch waits for a launch
    thread), launching (900), booting (900), bootstrapping (900), draining (120). Unset states
    keep those limits."""

    idle_seconds: IdleSeconds = 0
    """How long a rented machine stays up, its worker running, after its job ends, so the next
    job that fits it takes it without a launch or bootstrap; its idle time is charged. 0: it is
    torn down when its job ends. At most 86400 (a day). A provider's own `idle_seconds` overrides
    this one."""

    @field_validator("ssh_cidr")
    @classmethod
    def _cidr(cls, value: str | None) -> str | None:
        from gpulayer.cloud.network import normalized_cidr

        return None if value is None else normalized_cidr(value)

    @field_validator("state_timeouts")
    @classmethod
    def _states(cls, value: dict[str, float]) -> dict[str, float]:
        from gpulayer.cloud.lifecycle.states import SETTABLE_LIMITS

        unknown = sorted(set(value) - SETTABLE_LIMITS)
        if unknown:
            allowed = ", ".join(sorted(SETTABLE_LIMITS))
            raise ValueError(f"{', '.join(unknown)}: not a state with a limit ({allowed})")
        return value

    @field_validator("deadman_action")
    @classmethod
    def _action(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if value in ("poweroff", "stop") or (value.startswith("record:") and len(value) > 7):
            return value
        raise ValueError(f"{value!r}: expected poweroff, stop or record:PATH")
