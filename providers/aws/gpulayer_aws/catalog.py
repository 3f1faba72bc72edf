"""The instance catalog: hardware, on-demand and spot prices and zones per instance type and
region. Shipped with the plugin, so offers list without credentials or network; rebuilt by
:func:`refresh_catalog` (``gpulayer catalog refresh aws``) into the cache directory, where it
takes precedence.

Format (JSON)::

    {"as_of": "YYYY-MM-DD", "currency": "USD", "source": ..., "price_sources": {...},
     "hardware": {type: {vcpus, memory_gb, cpu_arch, gpu_name, gpu_maker, gpu_count,
                         gpu_memory_gb}},
     "on_demand": {type: {region: USD per hour}},
     "spot": {type: {region: lowest USD per hour among its zones}},
     "zones": {type: {region: [zone ids]}}}

Zones are availability zone ids (use1-az1), which name the same place in every account.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from gpulayer.cloud import CatalogInfo, ProviderError
from gpulayer_aws.errors import PROVIDER, aws_errors
from gpulayer_aws.region_prices import RegionPrices
from gpulayer_aws.settings import AwsSettings
from gpulayer_aws.shapes import Shape

REFRESHED_NAME = "price_catalog.json"

PriceSource = Literal["bulk", "api"]


@dataclass(frozen=True)
class PriceCatalog:
    on_demand: Mapping[str, Mapping[str, float]]
    as_of: str = ""
    source: str = ""
    currency: str = "USD"
    hardware: Mapping[str, Shape] = field(default_factory=dict)
    spot: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    zones: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)
    price_sources: Mapping[str, str] = field(default_factory=dict)
    """Where each price family came from (a URL or a publication), for the record."""
    path: Path | None = field(default=None, compare=False)

    def region(self, region: str) -> dict[str, float]:
        """Instance type -> on-demand price in ``region``."""
        return {name: prices[region] for name, prices in self.on_demand.items() if region in prices}

    def regions(self) -> list[str]:
        return sorted({r for prices in self.on_demand.values() for r in prices})

    def instance_types(self) -> list[str]:
        return sorted(self.on_demand)

    def info(self) -> CatalogInfo:
        return CatalogInfo(
            provider=PROVIDER,
            as_of=self.as_of,
            source=self.source,
            path=str(self.path) if self.path else None,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "as_of": self.as_of,
            "currency": self.currency,
            "price_sources": dict(sorted(self.price_sources.items())),
            "hardware": {k: v.to_json() for k, v in sorted(self.hardware.items())},
            "on_demand": {k: dict(sorted(v.items())) for k, v in sorted(self.on_demand.items())},
            "spot": {k: dict(sorted(v.items())) for k, v in sorted(self.spot.items()) if v},
            "zones": {
                k: {r: list(z) for r, z in sorted(v.items())}
                for k, v in sorted(self.zones.items())
                if v
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], path: Path | None = None) -> PriceCatalog:
        def prices(key: str) -> dict[str, dict[str, float]]:
            return {
                str(name): {str(r): float(p) for r, p in by_region.items()}
                for name, by_region in data.get(key, {}).items()
            }

        return cls(
            on_demand=prices("on_demand"),
            as_of=str(data.get("as_of", "")),
            source=str(data.get("source", "")),
            currency=str(data.get("currency", "USD")),
            hardware={
                str(name): Shape.from_json({**shape, "name": name})
                for name, shape in data.get("hardware", {}).items()
            },
            spot=prices("spot"),
            zones={
                str(name): {str(r): tuple(z) for r, z in by_region.items()}
                for name, by_region in data.get("zones", {}).items()
            },
            price_sources={str(k): str(v) for k, v in data.get("price_sources", {}).items()},
            path=path,
        )


def shipped_catalog() -> PriceCatalog:
    text = (resources.files("gpulayer_aws") / "data" / REFRESHED_NAME).read_text()
    return PriceCatalog.from_json(json.loads(text))


def load_catalog(cache_dir: Path) -> PriceCatalog:
    """The refreshed catalog in ``cache_dir`` when there is a readable one, else the shipped."""
    refreshed = Path(cache_dir) / REFRESHED_NAME
    try:
        return PriceCatalog.from_json(json.loads(refreshed.read_text()), refreshed)
    except (OSError, ValueError, AttributeError, TypeError):
        return shipped_catalog()


def save_catalog(catalog: PriceCatalog, cache_dir: Path) -> Path:
    from gpulayer.cloud import write_json_atomically

    return write_json_atomically(Path(cache_dir) / REFRESHED_NAME, catalog.to_json(), indent=1)


def refresh_catalog(
    settings: AwsSettings | Mapping[str, Any] | None = None,
    *,
    regions: Iterable[str] | None = None,
    instance_types: Iterable[str] | None = None,
    source: PriceSource = "api",
    on_region: Any = None,
    wait_seconds: float | None = None,
) -> Path:
    """Rebuild the catalog for ``regions`` (default: the settings' regions) and write it to
    the cache directory, where offers read it from then on.

    ``source``: "bulk", AWS's public bulk price list (no credentials; ``price_list_url``), or
    "api", the Pricing API (credentials with pricing:GetProducts). ``instance_types`` limits
    what is kept (default: every GPU type and the CPU types the shipped catalog has). Regions
    not refreshed keep what they had; hardware and zones the price list does not tell are
    kept from the catalog in use. ``on_region(region)`` is called as each region starts.
    ``wait_seconds`` bounds each wait for an answer from the price source. Returns the file
    written."""
    from gpulayer.cloud import load_settings

    config = load_settings(AwsSettings, settings, provider=PROVIDER)
    wanted_regions = list(regions or config.regions)
    shipped = shipped_catalog()
    keep = set(instance_types) if instance_types is not None else None
    current = load_catalog(config.default_cache_dir())

    def others(table: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
        return {
            name: {r: v for r, v in by_region.items() if r not in wanted_regions}
            for name, by_region in table.items()
        }

    on_demand = others(current.on_demand)
    spot = others(current.spot)
    hardware = dict(current.hardware)
    for region in wanted_regions:
        if on_region is not None:
            on_region(region)
        found = _region_prices(config, region, source, wait_seconds)
        if not found.on_demand:
            raise ProviderError(
                f"the {_SOURCE_NAMES[source]} returned no prices for {region}", provider=PROVIDER
            )
        for name, price in found.on_demand.items():
            if keep is None and not (_gpu_family(name) or name in shipped.on_demand):
                continue
            if keep is not None and name not in keep:
                continue
            on_demand.setdefault(name, {})[region] = price
            if name in found.hardware:
                hardware[name] = found.hardware[name]
    on_demand = {name: prices for name, prices in on_demand.items() if prices}
    catalog = PriceCatalog(
        on_demand=on_demand,
        as_of=datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        source=_SOURCE_NAMES[source] + " (AmazonEC2, Linux, shared tenancy, on-demand)",
        hardware={name: shape for name, shape in hardware.items() if name in on_demand},
        spot={name: prices for name, prices in spot.items() if prices and name in on_demand},
        zones={name: z for name, z in current.zones.items() if name in on_demand},
        price_sources={
            **current.price_sources,
            "on_demand": _source_url(config, source),
            "spot": "kept from the previous catalog; offers read spot prices live",
        },
    )
    return save_catalog(catalog, config.default_cache_dir())


_SOURCE_NAMES: dict[str, str] = {
    "bulk": "AWS public bulk price list",
    "api": "AWS Pricing API (get_products)",
}


def _source_url(config: AwsSettings, source: PriceSource) -> str:
    if source == "bulk":
        return f"{config.price_list_url}/offers/v1.0/aws/AmazonEC2/current/<region>/index.csv"
    return "AWS Pricing API get_products, ServiceCode AmazonEC2"


def _region_prices(
    config: AwsSettings, region: str, source: PriceSource, wait_seconds: float | None
) -> RegionPrices:
    if source == "bulk":
        from gpulayer_aws.price_list import fetch_region_price_list

        return fetch_region_price_list(config.price_list_url, region, wait_seconds=wait_seconds)
    from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError

    from gpulayer_aws.pricing import fetch_on_demand
    from gpulayer_aws.session import Clients

    with aws_errors(region):
        pricing = Clients(config, wait_seconds=wait_seconds).pricing()
        try:
            return RegionPrices(on_demand=fetch_on_demand(pricing, region))
        except (ReadTimeoutError, ConnectTimeoutError):
            if wait_seconds is None:
                raise
            raise ProviderError(
                f"no answer within {wait_seconds:g} s from the Pricing API", provider=PROVIDER
            ) from None


# Instance families with GPUs are named g* and p* (AMD ones such as g4ad are dropped later by
# their GpuInfo); the catalog keeps them all so that any region's GPU offers have a price.
def _gpu_family(instance_type: str) -> bool:
    return instance_type[:1] in ("g", "p")
