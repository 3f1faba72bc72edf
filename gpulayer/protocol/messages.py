"""Messages of the worker protocol: what the control plane hands a worker and hears back.

The same shapes travel in-process (the embedded local worker) and as JSON over HTTP.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

JOB_ARTIFACT_PREFIX = "job:"
SETUP_LOG_PREFIX = "[setup] "
"""A job's setup lines in its log start with this (system stream): its phase reads apart."""


def split_job_reference(reference: str) -> tuple[str, str]:
    """`job:<id>/<path>` -> (job id or prefix, path inside its outputs; "" for all of them)."""
    from gpulayer.errors import UsageError

    if not reference.startswith(JOB_ARTIFACT_PREFIX):
        raise UsageError(f"inputs: {reference!r} is not a job:<id>/<path> reference")
    job_ref, _, path = reference[len(JOB_ARTIFACT_PREFIX) :].partition("/")
    if not job_ref:
        raise UsageError(f"inputs: {reference!r} names no job")
    return job_ref, path.strip("/")


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")


class GangNode(Message):
    """Where one node of a multi-node job stands in its gang."""

    node_rank: int
    num_nodes: int
    master_addr: str
    """Node rank 0's worker address: the rendezvous (torchrun's master) runs there."""
    node_addr: str
    """This node's own worker address (its interface carries gloo/NCCL traffic)."""
    node_addrs: list[str] = Field(default_factory=list)
    """Every node's worker address, by node rank (empty from an older control plane)."""


class Assignment(Message):
    attempt_id: int
    job_id: str
    attempt: int
    spec: dict[str, Any]
    gpu_indices: list[int] = Field(default_factory=list)
    working_dir: str | None = None
    """Run in this directory as it is (local jobs without a source bundle)."""
    has_bundle: bool = False
    """The job's source is a bundle to fetch from the control plane and unpack."""
    bundle_digest: str | None = None
    """The bundle's SHA-256, when the control plane keeps it by content: a worker that has
    it cached by this digest need not fetch it again."""
    gang: GangNode | None = None
    """Set for one node of a multi-node job."""
    secret_values: dict[str, str] = Field(default_factory=dict, repr=False)
    """Values of the job's secrets its submitting shell had, by the variable each is read
    from: for a worker on a rented machine, which has none of them (never stored or logged)."""


class LogBatch(Message):
    lines: list[tuple[Literal["stdout", "stderr", "system"], str]]
    """(stream, text) pairs: stream is stdout, stderr or system."""


# The sizes of the store's columns: a longer value is refused here, not by the database.
ExitCode = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]


class AttemptReport(Message):
    state: Literal["succeeded", "failed", "cancelled"]
    reason: Annotated[str, Field(max_length=32)] | None = None
    exit_code: ExitCode | None = None
    result: Any = None
    message: str | None = None
    logs: list[tuple[Literal["stdout", "stderr", "system"], str]] = Field(default_factory=list)
    """The attempt's last output lines, stored before the outcome: a short job's output and
    its end travel in one request."""


class AttemptFinish(Message):
    attempt_id: Annotated[int, Field(ge=0, le=2**63 - 1)]
    report: AttemptReport


MAX_FINISHES_PER_BATCH = 500


class FinishBatch(Message):
    """Several of one worker's attempts ending at once: one request, each checked alone."""

    reports: Annotated[list[AttemptFinish], Field(min_length=1, max_length=MAX_FINISHES_PER_BATCH)]


class FinishOutcome(Message):
    attempt_id: int
    outcome: Literal["recorded", "stale", "refused"]
    """recorded: the report is the attempt's end; stale: the attempt was given up on (fenced,
    finished, an earlier life of its worker); refused: not this worker's, or not storable."""
    detail: str | None = None


class FinishReply(Message):
    results: list[FinishOutcome]


class Registration(Message):
    name: Annotated[str, Field(min_length=1, max_length=128)]
    kind: Literal["local", "remote", "cloud"] = "remote"
    labels: dict[str, str] = Field(default_factory=dict)
    capabilities: dict[str, Any]
    worker_id: Annotated[str, Field(min_length=1, max_length=32)] | None = None
    """Set when a worker re-registers under the id it had (it gets a new epoch)."""
    instance_request_id: str | None = None
    """A cloud worker names the launch request of the instance it runs on, so the control
    plane binds it to that instance's reservation (and its job) by id."""


DegradedReason = Annotated[
    str, Field(min_length=1, max_length=120, pattern=r"^[a-z0-9 ,:()-]+$")
]
"""A worker's own words for why it takes no job, shown as ``degraded: <reason>``."""


class Heartbeat(Message):
    running: list[Annotated[int, Field(ge=0, le=2**63 - 1)]] = Field(default_factory=list)
    """Every attempt the worker holds: claimed, preparing or running."""
    degraded: DegradedReason | None = None
    """Why the worker takes no job now (``disk full``); None when it takes them."""


class ClaimRequest(Message):
    ending: list[Annotated[int, Field(ge=0, le=2**63 - 1)]] = Field(default_factory=list)
    """Attempts the worker already ends for a cancel: the claim does not return early for them."""


class ClaimReply(Message):
    """What a claim long-poll returns when the worker asks for signals as well as work."""

    assignments: list[Assignment] = Field(default_factory=list)
    cancel_attempts: list[int] = Field(default_factory=list)
    """Attempts of this worker whose jobs were cancelled and that it did not say it ends."""


TOKEN_LIFETIME_MAX_SECONDS = 10 * 365.25 * 86400
"""The furthest ahead a token's expiry may lie: ten years."""


class TokenRequest(Message):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["admin", "worker", "join"] = "worker"
    """"worker" (or "join"): a join token that may only register workers."""
    name: str = Field(default="", max_length=128)
    expires_at: Annotated[float, Field(allow_inf_nan=False)] | None = None
    max_workers: int | None = Field(default=None, ge=1, le=1_000_000)

    @field_validator("expires_at")
    @classmethod
    def _within_ten_years(cls, value: float | None) -> float | None:
        # A time the store, the listings and every comparison can hold (see views.iso).
        now = time.time()
        if value is not None and not now < value <= now + TOKEN_LIFETIME_MAX_SECONDS:
            raise ValueError("must lie between now and ten years from now (seconds since 1970)")
        return value


class HeartbeatReply(Message):
    cancel_attempts: list[int] = Field(default_factory=list)
    """Attempts of this worker whose jobs were cancelled: end them."""
    fenced_attempts: list[int] = Field(default_factory=list)
    """Attempts this worker must drop: they were given up on and may run elsewhere."""
