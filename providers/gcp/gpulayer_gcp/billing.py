"""Prices from the Cloud Billing Catalog API: Compute Engine's SKUs, read as per-region rates
(a family's vCPU and GiB of memory, one GPU), on-demand and spot, and the catalog repriced with
them. The SKU list is large and slow to page through, so it is kept in the disk cache."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpulayer_gcp.catalog import PriceCatalog, RegionPrices, load_catalog, save_catalog

COMPUTE_SERVICE = "services/6F81-5844-456A"
"""Compute Engine's service id in the Cloud Billing Catalog."""

# "N1 Predefined Instance Core running in Americas", "Spot Preemptible A2 Instance Ram ...".
_HOST_RE = re.compile(
    r"^(?P<spot>Spot Preemptible |Preemptible )?(?P<family>E2|N1|A2|A3|G2) "
    r"(?:Predefined )?Instance (?P<part>Core|Ram)\b"
)
# "Nvidia Tesla T4 GPU running in Americas", "Spot Preemptible Nvidia H100 80GB GPU ...".
_GPU_RE = re.compile(r"^(?P<spot>Spot Preemptible |Preemptible )?Nvidia (?P<model>.+?) GPU\b")
_GPU_MODELS = {
    "Tesla T4": "nvidia-tesla-t4",
    "Tesla P4": "nvidia-tesla-p4",
    "Tesla V100": "nvidia-tesla-v100",
    "Tesla P100": "nvidia-tesla-p100",
    "Tesla A100": "nvidia-tesla-a100",
    "Tesla A100 80GB": "nvidia-a100-80gb",
    "A100 80GB": "nvidia-a100-80gb",
    "H100 80GB": "nvidia-h100-80gb",
    "L4": "nvidia-l4",
}
_SKIPPED_WORDS = ("Custom", "Sole Tenancy", "Commitment", "Reserved", "DWS", "Calendar", "Mega")


@dataclasses.dataclass(frozen=True)
class Rate:
    kind: str
    """"core", "ram" (per vCPU, per GiB, of ``key``'s family) or "gpu" (``key`` an accelerator)."""
    key: str
    spot: bool
    region: str
    usd_per_hour: float


def _unit_price(sku: Mapping[str, Any]) -> float | None:
    infos = sku.get("pricing_info") or sku.get("pricingInfo") or []
    if not infos:
        return None
    expression = infos[0].get("pricing_expression") or infos[0].get("pricingExpression") or {}
    tiers = expression.get("tiered_rates") or expression.get("tieredRates") or []
    if not tiers:
        return None
    price = tiers[-1].get("unit_price") or tiers[-1].get("unitPrice") or {}
    if (price.get("currency_code") or price.get("currencyCode") or "USD") != "USD":
        return None
    return float(price.get("units") or 0) + float(price.get("nanos") or 0) / 1e9


def parse_sku(sku: Mapping[str, Any]) -> list[Rate]:
    """The rates one SKU sets (one per region it serves); none for SKUs offers do not use."""
    description = str(sku.get("description", ""))
    if any(word in description for word in _SKIPPED_WORDS):
        return []
    category = sku.get("category") or {}
    usage = category.get("usage_type") or category.get("usageType") or ""
    if usage not in ("OnDemand", "Preemptible"):
        return []
    host = _HOST_RE.match(description)
    gpu = _GPU_RE.match(description)
    if host:
        kind, key = host.group("part").lower(), host.group("family").lower()
    elif gpu and gpu.group("model") in _GPU_MODELS:
        kind, key = "gpu", _GPU_MODELS[gpu.group("model")]
    else:
        return []
    spot = usage == "Preemptible" or bool((host or gpu) and (host or gpu).group("spot"))  # type: ignore[union-attr]
    price = _unit_price(sku)
    if price is None:
        return []
    regions = sku.get("service_regions") or sku.get("serviceRegions") or []
    return [Rate(kind, key, spot, str(r), price) for r in regions]


def reprice(
    current: PriceCatalog, skus: Iterable[Mapping[str, Any]], regions: Iterable[str]
) -> PriceCatalog:
    """``current`` with the prices of ``regions`` computed from ``skus``; a price the SKUs do
    not give keeps its current value. Pure."""
    wanted = set(regions)
    rates: dict[tuple[str, str, bool, str], float] = {}
    for sku in skus:
        for rate in parse_sku(sku):
            if rate.region in wanted:
                rates[(rate.kind, rate.key, rate.spot, rate.region)] = rate.usd_per_hour
    new_regions = dict(current.regions)
    for region, prices in current.regions.items():
        if region not in wanted:
            continue
        machines = {}
        for name, old in prices.machines.items():
            shape = current.machine_types.get(name)
            family = name.split("-", 1)[0]
            pair: list[float | None] = []
            for position, spot in enumerate((False, True)):
                core = rates.get(("core", family, spot, region))
                ram = rates.get(("ram", family, spot, region))
                if shape is not None and core is not None and ram is not None:
                    pair.append(round(shape.vcpus * core + shape.memory_gb * ram, 6))
                else:
                    pair.append(old[position])
            machines[name] = (pair[0], pair[1])
        gpus = {
            name: (
                rates.get(("gpu", name, False, region), old[0]),
                rates.get(("gpu", name, True, region), old[1]),
            )
            for name, old in prices.gpus.items()
        }
        new_regions[region] = RegionPrices(prices.zones, machines, gpus, prices.accelerator_zones)
    return dataclasses.replace(
        current,
        regions=new_regions,
        as_of=datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        source="Cloud Billing Catalog API (Compute Engine SKUs: host vCPU and memory, GPUs; "
        "on-demand and spot)",
        sources=(f"cloudbilling {COMPUTE_SERVICE}",),
        # Every price now comes from the Billing API; a type it has no SKU for keeps none.
        price_sources={},
        path=None,
    )


def fetch_skus(settings: Any, *, wait_seconds: float | None = None) -> list[dict[str, Any]]:
    """Compute Engine's SKUs as dicts, from the disk cache while younger than the settings'
    ``catalog_ttl_seconds``, else from the Cloud Billing Catalog API."""
    from gpulayer.cloud import DiskCache

    cache = DiskCache(settings.default_cache_dir())
    key = f"billing-skus|{settings.endpoint_url or 'google'}"
    result: list[dict[str, Any]] = cache.get_or_fetch(
        key, settings.catalog_ttl_seconds, lambda: _list_skus(settings, wait_seconds)
    )
    return result


def _list_skus(settings: Any, wait_seconds: float | None = None) -> list[dict[str, Any]]:
    from google.cloud import billing_v1

    from gpulayer.cloud import ProviderError
    from gpulayer_gcp.errors import PROVIDER, gcp_errors
    from gpulayer_gcp.session import Clients

    credentials = Clients(settings).credentials()
    options = {"api_endpoint": settings.endpoint_url} if settings.endpoint_url else {}
    import requests

    with gcp_errors():
        client = billing_v1.CloudCatalogClient(
            transport="rest", credentials=credentials, client_options=options
        )
        try:
            return [
                billing_v1.Sku.to_dict(sku)
                for sku in client.list_skus(parent=COMPUTE_SERVICE, **_bounded(wait_seconds))
                if _compute_sku(sku.category.resource_family)
            ]
        except requests.exceptions.Timeout:
            if wait_seconds is None:
                raise
            raise ProviderError(
                f"no answer within {wait_seconds:g} s from the Cloud Billing Catalog API",
                provider=PROVIDER,
            ) from None


def _bounded(wait_seconds: float | None) -> dict[str, Any]:
    """A request bounded to ``wait_seconds``, given up rather than retried (the client's own
    retries would multiply the bound); {} keeps the client's defaults."""
    return {} if wait_seconds is None else {"timeout": wait_seconds, "retry": None}


def _compute_sku(family: str) -> bool:
    return family in ("Compute", "")


def refresh_catalog(
    settings: Any = None,
    *,
    regions: Iterable[str] | None = None,
    skus: Iterable[Mapping[str, Any]] | None = None,
    wait_seconds: float | None = None,
) -> Path:
    """Reprice the catalog from the Cloud Billing Catalog API for ``regions`` (default: the
    settings' regions and those the catalog has) and write it to the cache directory, where
    offers read it from then on. The SKU list is kept in the disk cache for the settings'
    ``catalog_ttl_seconds``; ``skus`` replaces the API (tests, an exported list). Machine
    types, GPUs and zones stay as the current catalog has them. ``wait_seconds`` bounds each
    request to the API. Returns the file written."""
    from gpulayer.cloud import load_settings
    from gpulayer_gcp.errors import PROVIDER
    from gpulayer_gcp.settings import GcpSettings

    config = load_settings(GcpSettings, settings, provider=PROVIDER)
    current = load_catalog(config.default_cache_dir())
    wanted = list(dict.fromkeys([*(regions or config.regions), *current.regions]))
    listed = list(skus) if skus is not None else fetch_skus(config, wait_seconds=wait_seconds)
    catalog = reprice(current, listed, wanted)
    return save_catalog(catalog, config.default_cache_dir())
