"""Prices from AWS: on-demand from the Pricing API's price list, spot from the spot price
history. Both answer per region; callers cache them."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

# One price per instance type: Linux without preinstalled software or licence, on shared
# hardware, as a plain on-demand instance (not a capacity reservation).
_ON_DEMAND_FILTERS = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
    "licenseModel": "No License required",
}


def on_demand_filters(region: str, instance_type: str | None = None) -> list[dict[str, str]]:
    wanted = {"regionCode": region, **_ON_DEMAND_FILTERS}
    if instance_type is not None:
        wanted["instanceType"] = instance_type
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in wanted.items()]


def parse_price_item(item: str | dict[str, Any]) -> tuple[str, str, float] | None:
    """One entry of a get_products PriceList (a JSON document) as (instance type, region,
    USD per hour); None for entries without an hourly on-demand USD price."""
    product = json.loads(item) if isinstance(item, str) else item
    attributes = product.get("product", {}).get("attributes", {})
    instance_type = attributes.get("instanceType")
    region = attributes.get("regionCode")
    if not instance_type or not region:
        return None
    for term in product.get("terms", {}).get("OnDemand", {}).values():
        for dimension in term.get("priceDimensions", {}).values():
            if str(dimension.get("unit", "")).lower() not in ("hrs", "hours"):
                continue
            usd = dimension.get("pricePerUnit", {}).get("USD")
            try:
                price = float(usd)
            except (TypeError, ValueError):
                continue
            if price > 0:
                return instance_type, region, price
    return None


def fetch_on_demand(pricing: Any, region: str) -> dict[str, float]:
    """Instance type -> on-demand USD per hour in ``region``, from the Pricing API."""
    prices: dict[str, float] = {}
    pages = pricing.get_paginator("get_products").paginate(
        ServiceCode="AmazonEC2",
        Filters=on_demand_filters(region),
        FormatVersion="aws_v1",
    )
    for page in pages:
        for item in page.get("PriceList", []):
            parsed = parse_price_item(item)
            if parsed is not None and parsed[1] == region:
                name, _, price = parsed
                # Several SKUs can survive the filters; the lowest is what a launch pays.
                prices[name] = min(price, prices.get(name, price))
    return prices


def fetch_spot(ec2: Any, instance_types: list[str]) -> dict[str, dict[str, float]]:
    """Instance type -> zone -> current spot USD per hour in the client's region."""
    latest: dict[tuple[str, str], tuple[datetime, float]] = {}
    paginator = ec2.get_paginator("describe_spot_price_history")
    now = datetime.now(timezone.utc)
    for start in range(0, len(instance_types), 100):
        pages = paginator.paginate(
            InstanceTypes=instance_types[start : start + 100],
            ProductDescriptions=["Linux/UNIX"],
            StartTime=now,
        )
        for page in pages:
            for entry in page.get("SpotPriceHistory", []):
                key = (entry["InstanceType"], entry["AvailabilityZone"])
                stamp = entry.get("Timestamp") or now
                if stamp.tzinfo is None:
                    stamp = stamp.replace(tzinfo=timezone.utc)
                try:
                    price = float(entry["SpotPrice"])
                except (KeyError, ValueError):
                    continue
                if key not in latest or stamp > latest[key][0]:
                    latest[key] = (stamp, price)
    spot: dict[str, dict[str, float]] = {}
    for (name, zone), (_, price) in latest.items():
        spot.setdefault(name, {})[zone] = price
    return spot
