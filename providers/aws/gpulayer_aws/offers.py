"""EC2 offers: every (instance type, zone, market) that can run a query's accelerator, priced.

Hardware comes from describe_instance_types, zones from describe_instance_type_offerings,
on-demand prices from the Pricing API or the catalog, spot prices from the spot price history.
Everything fetched is kept in a disk cache, so offers for a region cost API calls about once a
day (spot prices: every few minutes).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from gpulayer.cloud import DiskCache, Offer, OfferQuery, ProviderError, gpu_facts
from gpulayer_aws.catalog import PriceCatalog, load_catalog
from gpulayer_aws.errors import PROVIDER, aws_errors
from gpulayer_aws.pricing import fetch_on_demand, fetch_spot
from gpulayer_aws.session import Clients
from gpulayer_aws.settings import AwsSettings
from gpulayer_aws.shapes import Shape, fetch_shapes, fetch_zones

log = logging.getLogger(__name__)


def build_offers(
    shapes: list[Shape],
    zones: Mapping[str, list[str]],
    on_demand: Mapping[str, float],
    spot: Mapping[str, Mapping[str, float]],
    region: str,
    *,
    accelerator: str,
    allow_spot: bool,
    allowed_zones: Collection[str] = (),
) -> list[Offer]:
    """Offers for one region. CPU offers are limited to instance types with a known price
    (there are hundreds of CPU types and a CPU job is placed by price); GPU offers include
    unpriced types, which a cost cap then rejects."""
    offers = []
    for shape in usable_shapes(shapes, accelerator, on_demand):
        price = on_demand.get(shape.name)
        for zone in zones.get(shape.name, []):
            if allowed_zones and zone not in allowed_zones:
                continue
            fields = _offer_fields(shape, region, zone)
            offers.append(Offer(**fields, hourly_price=price, spot=False))
            spot_price = spot.get(shape.name, {}).get(zone)
            if allow_spot and spot_price is not None:
                offers.append(Offer(**fields, hourly_price=spot_price, spot=True))
    return offers


def usable_shapes(
    shapes: list[Shape], accelerator: str, on_demand: Mapping[str, float]
) -> list[Shape]:
    if accelerator == "cuda":
        # Only NVIDIA devices run CUDA; AMD and Gaudi types report GPUs too.
        return [s for s in shapes if s.nvidia]
    if accelerator == "cpu":
        return [s for s in shapes if not s.gpu_count and s.name in on_demand]
    return []


def catalog_offers(
    catalog: PriceCatalog,
    query: OfferQuery,
    *,
    regions: Sequence[str] | None,
    allow_spot: bool,
) -> list[Offer]:
    """Offers from the catalog alone (no API call): one per instance type, region and market,
    naming the region's zones. ``regions`` None: every region the catalog prices."""
    if query.accelerator not in ("cpu", "cuda"):
        return []
    wanted = set(query.regions)
    shapes = [catalog.hardware[name] for name in sorted(catalog.hardware)]
    offers = []
    for shape in shapes:
        if not (shape.nvidia if query.accelerator == "cuda" else not shape.gpu_count):
            continue
        prices = catalog.on_demand.get(shape.name, {})
        # A type may be sold in a region without an on-demand price (capacity blocks only):
        # it is listed unpriced, so a cost cap turns it down.
        known = sorted({*prices, *catalog.zones.get(shape.name, {})})
        for region in known:
            if (regions is not None and region not in regions) or (wanted and region not in wanted):
                continue
            price = prices.get(region)
            fields = _offer_fields(shape, region, None)
            fields["zones"] = tuple(catalog.zones.get(shape.name, {}).get(region, ()))
            if query.spot is not True:
                offers.append(Offer(**fields, hourly_price=price, spot=False))
            spot_price = catalog.spot.get(shape.name, {}).get(region)
            if allow_spot and query.spot is not False and spot_price is not None:
                offers.append(Offer(**fields, hourly_price=spot_price, spot=True))
    return offers


def _offer_fields(shape: Shape, region: str, zone: str | None) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "provider": PROVIDER,
        "instance_type": shape.name,
        "region": region,
        "zone": zone,
        "cpu_cores": shape.vcpus,
        "memory_gb": shape.memory_gb,
        "cpu_arch": shape.cpu_arch,
        "os": "linux",
        "currency": "USD",
    }
    if shape.gpu_count:
        facts = gpu_facts(shape.gpu_name)
        fields.update(
            accelerator="cuda",
            gpu_name=shape.gpu_name,
            gpu_count=shape.gpu_count,
            gpu_memory_gb=shape.gpu_memory_gb
            or (None if shape.gpu_slice else facts.memory_gb if facts else None),
            gpu_slice=shape.gpu_slice,
            gpu_memory_kind="dedicated",
            cuda_compute_capability=facts.compute_capability if facts else None,
        )
    return fields


class OfferSource:
    """Fetches and caches what offers are made of, per region."""

    def __init__(self, settings: AwsSettings, clients: Clients, cache: DiskCache) -> None:
        self._settings = settings
        self._clients = clients
        self._cache = cache

    def offers(self, query: OfferQuery) -> list[Offer]:
        if query.accelerator not in ("cpu", "cuda"):
            return []
        wanted = set(query.regions)
        regions = [r for r in self._settings.regions if not wanted or r in wanted]
        catalog = load_catalog(self._settings.default_cache_dir())
        offers: list[Offer] = []
        for region in regions:
            shapes = self.shapes(region)
            on_demand = self.on_demand(region, catalog.region(region))
            usable = usable_shapes(shapes, query.accelerator, on_demand)
            names = sorted(s.name for s in usable)
            if not names:
                continue
            zones = self.zones(region, names)
            want_spot = self._settings.allow_spot and query.spot is not False
            spot = self.spot(region, names) if want_spot else {}
            offers += build_offers(
                usable,
                zones,
                on_demand,
                spot,
                region,
                accelerator=query.accelerator,
                allow_spot=want_spot,
                allowed_zones=self._settings.subnet_ids.keys(),
            )
        return offers

    def _key(self, kind: str, region: str, extra: str = "") -> str:
        # Separate caches per endpoint, so a test server's answers never pass for AWS's, and
        # per credentials, so answers fetched with keys are never shown live to a caller
        # without them (its own fetch fails and it is shown the catalog).
        endpoint = self._settings.endpoint_url or "aws"
        return f"{kind}|{region}|{endpoint}|{self._clients.identity()}|{extra}"

    def shapes(self, region: str) -> list[Shape]:
        def fetch() -> list[dict[str, Any]]:
            with aws_errors(region):
                return [s.to_json() for s in fetch_shapes(self._clients.ec2(region))]

        ttl = self._settings.catalog_ttl_seconds
        raw = self._cache.get_or_fetch(self._key("shapes", region), ttl, fetch)
        return [Shape.from_json(item) for item in raw]

    def zones(self, region: str, names: list[str]) -> dict[str, list[str]]:
        def fetch() -> dict[str, list[str]]:
            with aws_errors(region):
                return fetch_zones(self._clients.ec2(region), names)

        key = self._key("zones", region, ",".join(names))
        result: dict[str, list[str]] = self._cache.get_or_fetch(
            key, self._settings.catalog_ttl_seconds, fetch
        )
        return result

    def spot(self, region: str, names: list[str]) -> dict[str, dict[str, float]]:
        def fetch() -> dict[str, dict[str, float]]:
            with aws_errors(region):
                return fetch_spot(self._clients.ec2(region), names)

        key = self._key("spot", region, ",".join(names))
        result: dict[str, dict[str, float]] = self._cache.get_or_fetch(
            key, self._settings.spot_price_ttl_seconds, fetch
        )
        return result

    def on_demand(self, region: str, catalog_prices: dict[str, float]) -> dict[str, float]:
        """Pricing API prices when configured and reachable, else the catalog's. API prices
        win per type; the catalog fills types the API did not price."""
        if self._settings.price_source != "api":
            return catalog_prices
        key = self._key("on-demand", region)
        failed_key = self._key("on-demand-failed", region)
        cached = self._cache.get(key, self._settings.catalog_ttl_seconds)
        if cached is None:
            # After a failure, wait as long as spot prices live before asking again.
            if self._cache.get(failed_key, self._settings.spot_price_ttl_seconds) is not None:
                return catalog_prices
            try:
                with aws_errors(region):
                    cached = fetch_on_demand(self._clients.pricing(), region)
            except ProviderError as exc:
                # Offers work without pricing:GetProducts; the catalog prices them instead.
                log.warning("aws: Pricing API failed (%s); using the price catalog", exc)
                self._cache.put(failed_key, str(exc))
                return catalog_prices
            self._cache.put(key, cached)
        return {**catalog_prices, **cached}
