"""Named fleets: warm capacity kept by the configuration rather than by a job.

``fleets:`` in providers.yaml lists fleets, each an offer filter (providers, regions, the
resources of one machine, a price cap) with ``min_nodes`` (machines kept up, bootstrapped and
idle, whether or not a job wants them), ``max_nodes`` (machines of the filter held at once)
and ``idle_seconds`` (how long a machine above ``min_nodes`` stays idle once its job ended):
dstack's fleets (``nodes: min..max``, ``idle_duration``) and SkyPilot's pools read alike.

    fleets:
      - name: train
        providers: [aws]
        resources: {accelerator: cuda, gpu_count: 1, gpu_models: [A10G]}
        max_hourly_cost: 2.0
        min_nodes: 1
        max_nodes: 4
        idle_seconds: 600

A job takes a fleet's machine by fit (its resources, providers, regions and cap fit the
machine's offer). Pure: the models, their validation into one line per problem, and the
questions the lifecycle asks (is this offer a fleet's; the rule a decision reads).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    ValidationError,
)

from gpulayer.cloud.orchestrator_settings import IdleSeconds
from gpulayer.spec.models import ResourceRequest

if TYPE_CHECKING:
    from gpulayer.spec import JobSpec

FLEETS_KEY = "fleets"
"""providers.yaml's key (as gpulayer.cloud.config names it)."""
FLEET_TAG = "gpulayer:fleet"
"""The tag a fleet's machines carry in their provider (and their record's tags)."""
MAX_FLEET_NODES = 256

MAX_NAME = 26
"""A fleet's top-up backoff is kept under ``fleet:NAME`` beside jobs' ids (32 characters)."""


def _fleet_name(value: str) -> str:
    if not re.fullmatch(rf"[a-z0-9][a-z0-9-]{{0,{MAX_NAME - 1}}}", value):
        raise ValueError(
            f"{value!r}: lowercase letters, digits and dashes, at most {MAX_NAME}, "
            "starting with a letter or digit"
        )
    return value


FleetName = Annotated[str, Strict(), AfterValidator(_fleet_name)]
Nodes = Annotated[int, Strict(), Field(ge=0, le=MAX_FLEET_NODES)]


class FleetSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    name: FleetName
    """The fleet's name: lowercase letters, digits and dashes, at most 26 (shown with its
    machines)."""
    providers: list[Annotated[str, Strict(), StringConstraints(min_length=1)]] = Field(
        default_factory=list
    )
    """Providers its machines may come from (empty: every enabled one)."""
    regions: list[Annotated[str, Strict(), StringConstraints(min_length=1)]] = Field(
        default_factory=list
    )
    """Regions (or zones) its machines may be in (empty: any)."""
    resources: ResourceRequest = Field(default_factory=ResourceRequest)
    """One machine's resources, as a job's `resources` says them."""
    max_hourly_cost: Annotated[float, Strict(), Field(ge=0)] | None = None
    """The most one machine may cost an hour (offers without a price are then refused)."""
    currency: Annotated[str, Strict(), StringConstraints(pattern=r"^[A-Z]{3}$")] = "USD"
    """The currency of max_hourly_cost."""
    min_nodes: Nodes = 0
    """Machines kept up at all times, bootstrapped and idle when no job uses them."""
    max_nodes: Annotated[int, Strict(), Field(ge=1, le=MAX_FLEET_NODES)] | None = None
    """The most machines of the fleet held at once (default: min_nodes, at least 1)."""
    idle_seconds: IdleSeconds | None = None
    """How long a machine above min_nodes stays idle after its job; default: its provider's
    idle_seconds."""

    @property
    def most(self) -> int:
        return self.max_nodes if self.max_nodes is not None else max(1, self.min_nodes)


@dataclass(frozen=True)
class FleetRule:
    """What the lifecycle's decisions read of a fleet."""

    name: str
    min_nodes: int
    max_nodes: int
    idle_seconds: float


def fleet_problems(value: Any, providers: Collection[str]) -> tuple[list[FleetSettings], list[str]]:
    """The fleets of ``fleets:`` and one ``fleets[NAME].field: message`` line per problem
    (``providers``: the provider sections of the same file)."""
    from gpulayer.cloud.settings import settings_problems

    if value is None:
        return [], []
    if not isinstance(value, list):
        return [], [f"{FLEETS_KEY}: must be a list of fleets, each with a name"]
    fleets: list[FleetSettings] = []
    problems: list[str] = []
    seen: set[str] = set()
    for index, entry in enumerate(value):
        name = entry.get("name") if isinstance(entry, Mapping) else None
        label = f"{FLEETS_KEY}[{name if isinstance(name, str) and name else index}]"
        if not isinstance(entry, Mapping):
            problems.append(f"{label}: must be a mapping of settings, not {entry!r}")
            continue
        try:
            fleet = FleetSettings.model_validate(dict(entry))
        except ValidationError as exc:
            problems.extend(f"{label}.{line}" for line in settings_problems(FleetSettings, exc))
            continue
        problems.extend(f"{label}.{line}" for line in _rules(fleet, providers))
        if fleet.name in seen:
            problems.append(f"{label}.name: another fleet has this name")
        seen.add(fleet.name)
        fleets.append(fleet)
    return fleets, problems


def _rules(fleet: FleetSettings, providers: Collection[str]) -> list[str]:
    problems = []
    if fleet.max_nodes is not None and fleet.min_nodes > fleet.max_nodes:
        problems.append(f"min_nodes: must be <= max_nodes ({fleet.max_nodes})")
    for name in fleet.providers:
        if name not in providers:
            listed = ", ".join(sorted(providers)) or "none"
            problems.append(
                f"providers: {name!r} is not a provider section of this file (listed: {listed})"
            )
    return problems


def fleet_rules(
    fleets: Sequence[FleetSettings], idle_seconds_of: Mapping[str, float], default_idle: float
) -> list[FleetRule]:
    """Each fleet's rule; a fleet without its own idle_seconds takes its provider's (the
    longest of its providers', when it names several or none)."""
    rules = []
    for fleet in fleets:
        idle = fleet.idle_seconds
        if idle is None:
            names = fleet.providers or list(idle_seconds_of)
            idle = max([idle_seconds_of.get(n, default_idle) for n in names] or [default_idle])
        rules.append(FleetRule(fleet.name, fleet.min_nodes, fleet.most, float(idle)))
    return rules


def fleet_spec(fleet: FleetSettings) -> JobSpec:
    """A job's spec that asks what one machine of the fleet is: its offers are the fleet's."""
    from gpulayer.spec import JobSpec

    return JobSpec.model_validate(
        {
            "name": f"fleet-{fleet.name}",
            "workload": {"kind": "command", "command": ["true"]},
            "resources": fleet.resources.model_dump(exclude_defaults=True),
            "placement": {
                "target": "cloud",
                "providers": list(fleet.providers),
                "regions": list(fleet.regions),
                "max_hourly_cost": fleet.max_hourly_cost,
                "currency": fleet.currency,
            },
        }
    )


ENDING_STATES = frozenset(
    {"draining", "terminating", "terminated", "never_launched", "handed_over"}
)
"""A machine in these states no longer counts against its fleet's min_nodes or max_nodes."""


class Machine(NamedTuple):
    """A live machine as the fleet rules read it."""

    key: str
    fleet: str | None
    state: str
    since: float
    """When it entered ``state``."""


@dataclass(frozen=True)
class FleetCount:
    members: dict[str, int]
    """Fleet -> its machines that count (live, not being torn down)."""
    kept: frozenset[str]
    """Idle machines kept without an idle limit: within their fleet's min_nodes."""


def count_fleets(machines: Iterable[Machine], rules: Iterable[FleetRule]) -> FleetCount:
    """Each fleet's machines, and which idle ones are kept: as many as min_nodes leaves beside
    the busy ones, those idle longest first (the newest idle ones are the first to go)."""
    wanted = {rule.name: rule for rule in rules}
    counted: dict[str, list[Machine]] = {name: [] for name in wanted}
    for machine in machines:
        if machine.fleet in counted and machine.state not in ENDING_STATES:
            counted[machine.fleet].append(machine)
    kept: set[str] = set()
    for name, mine in counted.items():
        idle = sorted((m for m in mine if m.state == "idle"), key=lambda m: (m.since, m.key))
        slots = max(0, wanted[name].min_nodes - (len(mine) - len(idle)))
        kept.update(m.key for m in idle[:slots])
    return FleetCount({name: len(mine) for name, mine in counted.items()}, frozenset(kept))


def idle_limits(
    machines: Sequence[Machine], rules: Sequence[FleetRule], idle_of: Callable[[str], float]
) -> dict[str, float | None]:
    """Each machine's idle limit as the lifecycle reads it: a kept fleet machine's is None (no
    limit), a fleet machine's is its fleet's idle_seconds (0 once its fleet is gone), any
    other's ``idle_of(machine key)`` (its provider's)."""
    count = count_fleets(machines, rules)
    by_name = {rule.name: rule for rule in rules}
    limits: dict[str, float | None] = {}
    for machine in machines:
        if machine.fleet is None:
            limits[machine.key] = idle_of(machine.key)
        elif machine.key in count.kept:
            limits[machine.key] = None
        else:
            rule = by_name.get(machine.fleet)
            limits[machine.key] = rule.idle_seconds if rule is not None else 0.0
    return limits
