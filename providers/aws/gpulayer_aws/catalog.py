"""The on-demand price catalog: shipped with the plugin (offline use, tests), and rebuilt from
the Pricing API by :func:`refresh_catalog` into the cache directory, where it takes precedence.

Format: ``{"as_of": ..., "currency": "USD", "on_demand": {type: {region: USD per hour}}}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any

from gpulayer.cloud.errors import ProviderError
from gpulayer_aws.errors import PROVIDER, aws_errors
from gpulayer_aws.settings import AwsSettings

REFRESHED_NAME = "price_catalog.json"


@dataclass(frozen=True)
class PriceCatalog:
    on_demand: Mapping[str, Mapping[str, float]]
    as_of: str = ""
    source: str = ""
    currency: str = "USD"
    path: Path | None = field(default=None, compare=False)

    def region(self, region: str) -> dict[str, float]:
        """Instance type -> on-demand price in ``region``."""
        return {name: prices[region] for name, prices in self.on_demand.items() if region in prices}

    def instance_types(self) -> list[str]:
        return sorted(self.on_demand)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "as_of": self.as_of,
            "currency": self.currency,
            "on_demand": {k: dict(v) for k, v in sorted(self.on_demand.items())},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], path: Path | None = None) -> PriceCatalog:
        on_demand = {
            str(name): {str(r): float(p) for r, p in prices.items()}
            for name, prices in data.get("on_demand", {}).items()
        }
        return cls(
            on_demand=on_demand,
            as_of=str(data.get("as_of", "")),
            source=str(data.get("source", "")),
            currency=str(data.get("currency", "USD")),
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
    except (OSError, ValueError, AttributeError):
        return shipped_catalog()


def save_catalog(catalog: PriceCatalog, cache_dir: Path) -> Path:
    from gpulayer.cloud.cache import write_json_atomically

    return write_json_atomically(Path(cache_dir) / REFRESHED_NAME, catalog.to_json(), indent=1)


def refresh_catalog(
    settings: AwsSettings | Mapping[str, Any] | None = None,
    *,
    regions: Iterable[str] | None = None,
    instance_types: Iterable[str] | None = None,
) -> Path:
    """Rebuild the catalog from the Pricing API for ``regions`` (default: the settings'
    regions) and write it to the cache directory, where offers read it from then on.
    ``instance_types`` limits what is kept (default: every GPU type and the shipped CPU types).
    Spot prices move too fast for a catalog; offers read them live. Returns the file written."""
    from gpulayer.cloud.settings import load_settings
    from gpulayer_aws.pricing import fetch_on_demand
    from gpulayer_aws.session import Clients

    config = load_settings(AwsSettings, settings, provider=PROVIDER)
    wanted_regions = list(regions or config.regions)
    shipped = shipped_catalog()
    keep = set(instance_types) if instance_types is not None else None
    clients = Clients(config)
    # Regions not refreshed now keep the prices they had.
    current = load_catalog(config.default_cache_dir())
    on_demand = {
        name: {r: p for r, p in prices.items() if r not in wanted_regions}
        for name, prices in current.on_demand.items()
    }
    for region in wanted_regions:
        with aws_errors(region):
            prices = fetch_on_demand(clients.pricing(), region)
        if not prices:
            raise ProviderError(
                f"the Pricing API returned no prices for {region}", provider=PROVIDER
            )
        for name, price in prices.items():
            if keep is None and not (_gpu_family(name) or name in shipped.on_demand):
                continue
            if keep is not None and name not in keep:
                continue
            on_demand.setdefault(name, {})[region] = price
    catalog = PriceCatalog(
        on_demand={name: prices for name, prices in on_demand.items() if prices},
        as_of=datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        source="AWS Pricing API (get_products, AmazonEC2, Linux, shared tenancy, on-demand)",
    )
    return save_catalog(catalog, config.default_cache_dir())


# Instance families with GPUs are named g* and p* (AMD ones such as g4ad are dropped later by
# their GpuInfo); the catalog keeps them all so that any region's GPU offers have a price.
def _gpu_family(instance_type: str) -> bool:
    return instance_type[:1] in ("g", "p")
