"""One region's price list as the catalog refresh reads it (its own module, so the price-list
readers and the catalog both use it without importing each other)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpulayer_aws.shapes import Shape


@dataclass
class RegionPrices:
    """What one region's price list says: on-demand prices and, where the list tells it,
    the hardware of each type."""

    on_demand: dict[str, float] = field(default_factory=dict)
    hardware: dict[str, Shape] = field(default_factory=dict)
