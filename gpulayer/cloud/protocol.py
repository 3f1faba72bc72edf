"""The provider protocol: five verbs a cloud plugin implements, and the values they exchange.

Launch is idempotent by ``LaunchRequest.request_id`` (a retried launch returns the instance the
first call created) and terminate is idempotent (ending what is already gone succeeds), so the
orchestrator can retry after a crash without leaking or double-renting instances. Failures are
the typed errors of :mod:`gpulayer.cloud.errors`.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpulayer.cloud.offer import Offer, OfferQuery

InstanceState = Literal["pending", "running", "stopping", "terminated", "unknown"]
INSTANCE_STATES: tuple[InstanceState, ...] = (
    "pending",
    "running",
    "stopping",
    "terminated",
    "unknown",
)

# Request ids become cloud resource names and idempotency tokens (EC2 allows 64 characters).
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class LaunchRequest(BaseModel):
    """Everything a provider needs to start one instance for one job attempt."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    request_id: str
    """Unique per launch attempt; a new offer needs a new request id."""
    job_id: Annotated[str, Field(min_length=1)]
    owner: Annotated[str, Field(min_length=1)]
    """Names the controller installation, so its reaper finds only its own instances."""
    tags: dict[str, str] = Field(default_factory=dict)
    ssh_public_key: Annotated[str, Field(min_length=1)]
    """OpenSSH public key line the instance accepts for its login user."""
    allowed_ssh_cidr: str
    """The only network that may reach the instance's SSH port (the controller's address)."""
    image_release: str | None = None
    image: dict[str, Any] = Field(default_factory=dict)
    """Provider-specific image selector from the image release (e.g. AMI owners and name)."""
    disk_gb: Annotated[int, Field(ge=1)] | None = None
    spot: bool = False
    """The job accepts a spot instance; launching a spot offer without it is refused."""
    private_ip: str | None = None
    """Ask for this private address (it must lie in the instance's subnet)."""
    time_limit_seconds: Annotated[float, Field(gt=0)] | None = None
    """How long the job may run (its timeout_seconds), for providers that must say so when
    they allocate (a Slurm allocation's time limit); None: no limit asked."""
    provisioning_timeout_seconds: Annotated[float, Field(gt=0)] | None = None
    """How long the job may wait for its machine (its provisioning_timeout_seconds), for
    providers whose launch waits for capacity (a Slurm allocation pending in the queue)."""
    job_name: str | None = None
    """The job's name, for providers whose users see what runs under a name of its own (a
    Slurm allocation's job name in squeue); None: the job has none."""
    count: Annotated[int, Field(ge=1)] = 1
    """How many instances of the offer to start together, all or none (the nodes of a gang,
    see :class:`GangProvider`); ``launch`` takes 1 only."""
    progress: Callable[[str], None] | None = Field(default=None, exclude=True)
    """Where a launch that waits (for a host's SSH, say) reports how it is going, a line at a
    time; None: nowhere. Not part of the request's identity."""

    @field_validator("request_id")
    @classmethod
    def _request_id_form(cls, value: str) -> str:
        if not _REQUEST_ID_RE.match(value):
            raise ValueError("1 to 64 of letters, digits, '_', '.' and '-', starting alphanumeric")
        return value

    @field_validator("allowed_ssh_cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        from gpulayer.cloud.network import normalized_cidr

        return normalized_cidr(value)

    @field_validator("private_ip")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address") from None


class SshVia(BaseModel):
    """A host the controller reaches an instance's SSH through (OpenSSH's ProxyJump), with
    the controller's own credential for it: a cluster's login node, in front of compute
    nodes only it can reach."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str
    port: int = 22
    user: str
    key_path: str
    """A private key file on the controller's machine (a path, never the key)."""
    host_key: str | None = None
    """Its SSH host public key when known; None means pin on first use."""


class JobKeyFile(BaseModel):
    """Where a launch wrote the job's public key for the machine's sshd to accept, and the
    setting that names that file: a refused key is reported against the setting to change."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    """As the setting says it (``~/.ssh/authorized_keys``)."""
    setting: str
    """Its place in providers.yaml (``ssh.hosts[host-1].authorized_keys``)."""


WorkerStart = Literal["bootstrap", "launcher"]
"""Who starts the worker on a machine: the bootstrap itself, or a launcher of the machine's own
(a Slurm allocation's step on each node) that the bootstrap hands the start off to."""

_LEGACY_TAGS = {
    "install_root": "gpulayer:install-root",
    "python": "gpulayer:python",
    "shared_dir": "gpulayer:wheelhouse-root",
    "worker_start": "gpulayer:worker-start",
}
"""The tags that said what these fields say, in instances stored before the fields existed."""


class Instance(BaseModel):
    """A provider's instance as last described. States are normalized across providers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    provider: str
    region: str
    zone: str | None = None
    state: InstanceState
    instance_type: str | None = None
    public_ip: str | None = None
    private_ip: str | None = None
    ssh_host: str | None = None
    """The address to reach SSH on, public or private as the provider is configured."""
    ssh_user: str
    ssh_port: int = 22
    host_key: str | None = None
    """The SSH host public key when the provider can tell it; None means pin on first use."""
    ssh_via: SshVia | None = None
    """Where ssh_host is reached from, when the controller cannot reach it directly: the
    bootstrap, its wheels and the worker's tunnel to the control plane all go through it."""
    hourly_price: float | None = None
    currency: str = "USD"
    spot: bool = False
    tags: dict[str, str] = Field(default_factory=dict)
    launched_at: datetime | None = None
    reclaimed: bool = False
    """The instance ended (or is ending) without gpulayer asking: the provider took it back
    (a spot reclaim or preemption) or someone ended it from outside; its attempt ends as
    ``preempted``. Providers record their own terminate before the call, so they can tell the
    two apart."""
    install_root: str | None = None
    """Where the bootstrap installs (a directory per job below it); None: gpulayer's default."""
    python: str | None = None
    """The interpreter the worker is installed with; None: ``python3``."""
    worker_start: WorkerStart = "bootstrap"
    """``launcher``: a launcher of the machine's own starts the worker, so the bootstrap
    hands the start off to it."""
    shared_dir: str | None = None
    """A directory every node of the machine's cluster sees (a shared filesystem): the
    bootstrap keeps the wheels there, so they travel once for all the nodes."""
    job_key_file: JobKeyFile | None = None
    """Where the launch wrote the job's key; None: the provider installs it some other way
    (a cloud's key pair)."""
    tunnel_address: str | None = None
    """With a launcher: the worker runs on other machines that share the install dir with the
    SSH host (a Slurm allocation's nodes, bootstrapped through its login node over the cluster's
    shared filesystem, never logged into), and reaches the control plane's tunnel at this
    address of the SSH host. None: the worker runs on the SSH host itself."""
    ends_at: datetime | None = None
    """When the provider ends the machine whatever runs on it (a Slurm allocation's time
    limit); None: not before it is terminated. A warm machine takes only a job whose timeout
    ends before this."""

    @model_validator(mode="before")
    @classmethod
    def _fields_from_legacy_tags(cls, data: Any) -> Any:
        # Instances stored before these fields existed (a live record across an upgrade, a
        # claim or allocation on disk) said the same in tags: read them once, here.
        if not isinstance(data, dict):
            return data
        tags = data.get("tags") or {}
        missing = {f: tags[t] for f, t in _LEGACY_TAGS.items() if f not in data and t in tags}
        return {**data, **missing} if missing else data

    @property
    def live(self) -> bool:
        return self.state in ("pending", "running")

    def lasts_for(self, seconds: float | None, now: datetime) -> bool:
        """Whether a job of ``seconds`` (None: no timeout) started ``now`` ends before the
        provider ends the machine."""
        if self.ends_at is None:
            return True
        return seconds is not None and (self.ends_at - now).total_seconds() > seconds


def launch_zone(offer: Offer, request: LaunchRequest, provider: str) -> str:
    """The zone a launch of ``offer`` for ``request`` goes to, after the checks every provider
    makes: the offer is the provider's, spot only for a request that accepts it, a zone named."""
    from gpulayer.cloud.errors import ProviderError

    if offer.provider != provider:
        raise ProviderError(f"offer {offer.label} is not a {provider} offer", provider=provider)
    if offer.spot and not request.spot:
        raise ProviderError(
            f"offer {offer.label} is spot capacity but the request does not accept spot",
            provider=provider,
        )
    if offer.zone is None:
        raise ProviderError(f"offer {offer.label} names no zone", provider=provider)
    return offer.zone


@runtime_checkable
class Provider(Protocol):
    """A cloud plugin. Implementations are registered under the entry-point group
    ``gpulayer.providers`` and constructed with their settings mapping."""

    name: str

    def offers(self, query: OfferQuery) -> list[Offer]:
        """Priced offers that may fit ``query``; callers filter and rank them again."""
        ...

    def launch(self, offer: Offer, request: LaunchRequest) -> Instance:
        """Start one instance; calling again with the same request id returns the same one."""
        ...

    def describe(self, ids: Sequence[str]) -> list[Instance]:
        """The instances among ``ids`` that the provider still knows of."""
        ...

    def terminate(self, ids: Sequence[str]) -> None:
        """End the instances and whatever was created for them; gone already is fine."""
        ...

    def list_owned(self, tags: Mapping[str, str]) -> list[Instance]:
        """Instances not yet terminated that carry all of ``tags`` (for the reaper)."""
        ...


@runtime_checkable
class GangProvider(Provider, Protocol):
    """An ability: the provider can start the nodes of a multi-node job together. One that is
    not a GangProvider is never asked for a gang. A plugin declares it by inheriting it; the
    registry checks its shape when the plugin is loaded (:mod:`gpulayer.cloud.contract`)."""

    def launch_gang(self, offer: Offer, request: LaunchRequest) -> list[Instance]:
        """Start ``request.count`` instances like ``offer``, reachable from each other, in one
        zone (else one region), all or none: when fewer could be had, nothing is left and a
        ``CapacityError`` says so. Returned in node-rank order; idempotent by request id."""
        ...


@runtime_checkable
class FinishingProvider(Provider, Protocol):
    """An ability: the provider ends the machines of a job that ended by itself (it succeeded
    or failed, and its worker was stopped) otherwise than a cancel's: a Slurm allocation's
    batch script returns, so the cluster's accounting reads COMPLETED, not CANCELLED.
    ``finish`` is for those ends, ``terminate`` for every other."""

    def finish(self, ids: Sequence[str]) -> None:
        """End the instances as their job's own end; gone already is fine. Like terminate,
        whatever was created for them goes too."""
        ...


class OffersAreMachines:
    """An ability (a mixin): each of the provider's offers is one machine (a fixed pool of
    hosts), so the orchestrator gives an offer to one job at a time."""


class OutlivesReclaim:
    """An ability (a mixin): a machine the provider took back keeps running with gpulayer's
    worker on it (a Slurm node handed to a preempting job), so its worker is stopped over its
    link. A cloud's reclaimed instance powers off by itself, and its link is not waited on."""


def shared_wheelhouse_dir(shared_dir: str | None, key: str) -> str | None:
    """Where a node keeps the wheelhouse ``key`` when its cluster shares ``shared_dir``;
    None: below the node's own install root."""
    return f"{shared_dir.rstrip('/')}/wheelhouse/{key}" if shared_dir else None


def node_install_dir(install_root: str, job_id: str, node_rank: int = 0) -> str:
    """Where node ``node_rank`` of a job installs its worker below a host's install root. The
    nodes get a dir each, so hosts that share a filesystem do not share an install."""
    name = job_id if node_rank == 0 else f"{job_id}-node{node_rank}"
    return f"{install_root}/{name}"


ProviderFactory = Callable[[Mapping[str, Any]], Provider]
