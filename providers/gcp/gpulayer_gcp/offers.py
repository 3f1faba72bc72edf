"""GCE offers: every (machine, GPUs, zone, market) that can run a query's accelerator, priced
as the host VM plus its GPUs.

Where machines and GPUs are offered comes from the aggregated machine-type and accelerator-type
lists (kept in the disk cache), or, with ``offers_source: catalog`` or without credentials
for a provider that is not enabled, from the catalog alone. A2, A3 and G2 machines carry fixed
GPUs; N1 hosts take T4, V100, P100 or P4 in the counts GCE allows, named ``HOST+COUNTxGPU``
(``n1-standard-8+1xt4``) so that each combination is an instance type of its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gpulayer.cloud import DiskCache, Offer, OfferQuery, gpu_facts
from gpulayer_gcp.catalog import AcceleratorFacts, MachineShape, PriceCatalog, load_catalog
from gpulayer_gcp.errors import PROVIDER, gcp_errors
from gpulayer_gcp.session import Clients
from gpulayer_gcp.settings import GcpSettings, zone_region

_ATTACHED_RE = re.compile(r"^(?P<host>[a-z0-9-]+)\+(?P<count>\d+)x(?P<gpu>[a-z0-9-]+)$")


def short_gpu(accelerator: str) -> str:
    """nvidia-tesla-t4 -> t4, nvidia-l4 -> l4."""
    return accelerator.removeprefix("nvidia-").removeprefix("tesla-")


@dataclass(frozen=True)
class Machine:
    """What an offer launches: a machine type and the GPUs it gets."""

    machine_type: str
    accelerator: str | None = None
    count: int = 0
    attached: bool = False
    """True when the GPUs are guestAccelerators of the launch (N1), not part of the type."""

    @property
    def instance_type(self) -> str:
        if self.attached and self.accelerator:
            return f"{self.machine_type}+{self.count}x{short_gpu(self.accelerator)}"
        return self.machine_type


def parse_instance_type(instance_type: str, catalog: PriceCatalog) -> Machine:
    """The machine an offer's instance type names (inverse of :attr:`Machine.instance_type`)."""
    match = _ATTACHED_RE.match(instance_type)
    if match:
        for name in catalog.accelerators:
            if short_gpu(name) == match.group("gpu"):
                return Machine(match.group("host"), name, int(match.group("count")), True)
        raise ValueError(f"{instance_type}: unknown GPU {match.group('gpu')!r}")
    shape = catalog.machine_types.get(instance_type)
    if shape is not None and shape.accelerator:
        return Machine(instance_type, shape.accelerator, shape.accelerator_count)
    return Machine(instance_type)


@dataclass(frozen=True)
class ZoneTypes:
    """What one zone offers: machine types (vCPUs, memory, fixed GPUs) and attachable GPUs."""

    machines: Mapping[str, MachineShape]
    accelerators: Mapping[str, int]
    """Accelerator type -> most cards per instance."""


def catalog_zones(catalog: PriceCatalog, region: str) -> dict[str, ZoneTypes]:
    """Zone -> what it offers, as the catalog says."""
    prices = catalog.regions.get(region)
    if prices is None:
        return {}
    result = {}
    for zone in prices.zones:
        accelerators = {
            name: max(catalog.accelerators[name].attach or {8: 0})
            for name, zones in prices.accelerator_zones.items()
            if zone in zones and name in catalog.accelerators
        }
        machines = {
            name: catalog.machine_types[name]
            for name in prices.machines
            if name in catalog.machine_types
            and (
                catalog.machine_types[name].accelerator is None
                or catalog.machine_types[name].accelerator in accelerators
            )
        }
        result[zone] = ZoneTypes(machines, accelerators)
    return result


def machines_for(
    zone_types: ZoneTypes, catalog: PriceCatalog, accelerator: str
) -> Iterator[tuple[Machine, MachineShape]]:
    """The machines of one zone that run ``accelerator`` (cpu: machines without GPUs)."""
    for name, shape in sorted(zone_types.machines.items()):
        if accelerator == "cpu" and not shape.accelerator and not shape.accelerator_count:
            yield Machine(name), shape
        elif accelerator == "cuda" and (shape.accelerator or "").startswith("nvidia-"):
            yield Machine(name, shape.accelerator, shape.accelerator_count), shape
    if accelerator != "cuda":
        return
    for host_name, host in sorted(zone_types.machines.items()):
        if not host_name.startswith("n1-") or host.accelerator:
            continue
        for gpu_name, most_cards in sorted(zone_types.accelerators.items()):
            facts = catalog.accelerators.get(gpu_name)
            if facts is None or not facts.attach:
                continue
            for count, most_vcpus in sorted(facts.attach.items()):
                if count <= most_cards and host.vcpus <= most_vcpus:
                    yield Machine(host_name, gpu_name, count, attached=True), host


def price_of(machine: Machine, catalog: PriceCatalog, region: str, *, spot: bool) -> float | None:
    """Host plus GPUs in ``region``; None when any part has no price."""
    prices = catalog.regions.get(region)
    if prices is None:
        return None
    position = 1 if spot else 0
    host = prices.machines.get(machine.machine_type, (None, None))[position]
    if host is None:
        return None
    if not machine.accelerator:
        return round(host, 6)
    gpu = prices.gpus.get(machine.accelerator, (None, None))[position]
    if gpu is None:
        return None
    return round(host + machine.count * gpu, 6)


def build_offers(
    zones: Mapping[str, ZoneTypes],
    catalog: PriceCatalog,
    region: str,
    *,
    accelerator: str,
    allow_spot: bool,
) -> list[Offer]:
    """Offers of one region. CPU offers only for priced machine types (a CPU job is placed by
    price); GPU offers include unpriced ones, which a cost cap then rejects."""
    offers = []
    for zone, zone_types in sorted(zones.items()):
        for machine, shape in machines_for(zone_types, catalog, accelerator):
            price = price_of(machine, catalog, region, spot=False)
            if accelerator == "cpu" and price is None:
                continue
            fields = _offer_fields(machine, shape, catalog, region, zone)
            offers.append(Offer(**fields, hourly_price=price, spot=False))
            spot_price = price_of(machine, catalog, region, spot=True)
            if allow_spot and spot_price is not None:
                offers.append(Offer(**fields, hourly_price=spot_price, spot=True))
    return offers


def _offer_fields(
    machine: Machine, shape: MachineShape, catalog: PriceCatalog, region: str, zone: str
) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "provider": PROVIDER,
        "instance_type": machine.instance_type,
        "region": region,
        "zone": zone,
        "cpu_cores": shape.vcpus,
        "memory_gb": shape.memory_gb,
        "cpu_arch": "x86_64",
        "os": "linux",
        "currency": catalog.currency,
        "price_as_of": catalog.as_of or None,
    }
    if machine.accelerator:
        known: AcceleratorFacts | None = catalog.accelerators.get(machine.accelerator)
        gpu_name = known.gpu if known else machine.accelerator
        facts = gpu_facts(gpu_name)
        fields.update(
            accelerator="cuda",
            gpu_name=gpu_name,
            gpu_count=machine.count,
            gpu_memory_gb=known.memory_gb if known else (facts.memory_gb if facts else None),
            gpu_memory_kind="dedicated",
            cuda_compute_capability=facts.compute_capability if facts else None,
        )
    return fields


def per_region(offers: list[Offer]) -> list[Offer]:
    """Catalog offers as the offer pipeline lists them: one per (instance type, region,
    market) with the zones that have it, instead of one per zone."""
    grouped: dict[tuple[str, str, bool], list[Offer]] = {}
    for offer in offers:
        grouped.setdefault((offer.instance_type, offer.region, offer.spot), []).append(offer)
    return [
        same[0].model_copy(
            update={"zone": None, "zones": tuple(sorted(o.zone for o in same if o.zone))}
        )
        for same in grouped.values()
    ]


class OfferSource:
    """Offers from the API's zone lists (cached) or the catalog alone, priced by the catalog."""

    def __init__(self, settings: GcpSettings, clients: Clients, cache: DiskCache) -> None:
        self._settings = settings
        self._clients = clients
        self._cache = cache

    def catalog(self) -> PriceCatalog:
        return load_catalog(self._settings.default_cache_dir())

    def offers(
        self, query: OfferQuery, *, catalog_only: bool = False, everywhere: bool = False
    ) -> list[Offer]:
        if query.accelerator not in ("cpu", "cuda"):
            return []
        catalog = self.catalog()
        wanted = set(query.regions)
        configured = sorted(catalog.regions) if everywhere else list(self._settings.regions)
        regions = [r for r in configured if not wanted or r in wanted]
        use_api = self._settings.offers_source == "api" and not catalog_only
        listed = self.listed_zones(regions) if use_api else {}
        want_spot = self._settings.allow_spot and query.spot is not False
        offers: list[Offer] = []
        for region in regions:
            zones = listed.get(region, {}) if use_api else catalog_zones(catalog, region)
            allowed = set(self._settings.allowed_zones(region, list(zones)))
            zones = {z: types for z, types in zones.items() if z in allowed}
            offers += build_offers(
                zones, catalog, region, accelerator=query.accelerator, allow_spot=want_spot
            )
        return per_region(offers) if catalog_only else offers

    def listed_zones(self, regions: list[str]) -> dict[str, dict[str, ZoneTypes]]:
        """Region -> zone -> what the API lists there, for ``regions``."""
        raw = self._cache.get_or_fetch(
            self._key("zone-types"), self._settings.catalog_ttl_seconds, self._fetch
        )
        result: dict[str, dict[str, ZoneTypes]] = {}
        for zone, body in raw.items():
            region = zone_region(zone)
            if region not in regions:
                continue
            machines = {
                name: MachineShape(name, int(v[0]), float(v[1]), v[2], int(v[3]))
                for name, v in body["machines"].items()
            }
            result.setdefault(region, {})[zone] = ZoneTypes(machines, dict(body["accelerators"]))
        return result

    def _key(self, kind: str) -> str:
        # Separate caches per endpoint and project, so a test server's answers never pass for
        # Google's.
        endpoint = self._settings.endpoint_url or "google"
        return f"{kind}|{self._settings.project or 'default'}|{endpoint}"

    def _fetch(self) -> dict[str, dict[str, Any]]:
        from google.cloud import compute_v1

        project = self._clients.project
        # Every zone lists hundreds of machine types; only the families the catalog knows
        # can be priced or carry GPUs gpulayer schedules.
        families = sorted({name.split("-", 1)[0] for name in self.catalog().machine_types})
        zones: dict[str, dict[str, Any]] = {}
        with gcp_errors():
            machine_pages = self._clients.machine_types().aggregated_list(
                request=compute_v1.AggregatedListMachineTypesRequest(
                    project=project, filter=f'name eq "({"|".join(families)})-.*"'
                )
            )
            for scope, listed in machine_pages:
                zone = scope.removeprefix("zones/")
                for item in listed.machine_types:
                    accelerators = list(item.accelerators)
                    accel = accelerators[0].guest_accelerator_type if accelerators else None
                    count = sum(a.guest_accelerator_count for a in accelerators)
                    entry = zones.setdefault(zone, {"machines": {}, "accelerators": {}})
                    entry["machines"][item.name] = [
                        item.guest_cpus,
                        round(item.memory_mb / 1024, 2),
                        accel,
                        count,
                    ]
            accelerator_pages = self._clients.accelerator_types().aggregated_list(
                request=compute_v1.AggregatedListAcceleratorTypesRequest(project=project)
            )
            for scope, listed in accelerator_pages:
                zone = scope.removeprefix("zones/")
                for item in listed.accelerator_types:
                    entry = zones.setdefault(zone, {"machines": {}, "accelerators": {}})
                    entry["accelerators"][item.name] = item.maximum_cards_per_instance
        return zones
