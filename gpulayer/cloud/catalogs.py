"""What a provider's shipped catalog says about itself, and when it is too old to trust.

A provider plugin may ship a catalog of what it rents (hardware and prices), so that offers
list without credentials or network. Such a plugin is a :class:`CatalogProvider` (it inherits
the protocol, and the registry checks the methods' shapes when it loads the plugin); one whose
catalog can be rebuilt from the cloud's price data is a :class:`CatalogRefresher` too.

Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from gpulayer.cloud.offer import Offer, OfferQuery

STALE_AFTER_DAYS = 30
"""A catalog older than this gets a warning: prices change (AWS cut the P family by about
40% in 2025)."""


@dataclass(frozen=True)
class CatalogInfo:
    provider: str
    as_of: str
    """The day its facts were gathered, YYYY-MM-DD."""
    source: str
    """Where its prices come from."""
    path: str | None = None
    """The refreshed copy in use, or None for the copy shipped with the plugin."""

    def age_days(self, today: date | None = None) -> int | None:
        try:
            made = date.fromisoformat(self.as_of[:10])
        except ValueError:
            return None
        return ((today or date.today()) - made).days

    def stale_note(self, today: date | None = None) -> str | None:
        """A warning when the catalog is over :data:`STALE_AFTER_DAYS` old (or undated)."""
        age = self.age_days(today)
        refresh = f"gpulayer catalog refresh {self.provider}"
        if age is None:
            return f"{self.provider}: the price catalog is undated; run `{refresh}`"
        if age > STALE_AFTER_DAYS:
            return (
                f"{self.provider}: the price catalog is {age} days old (as of {self.as_of}); "
                f"prices may have changed: run `{refresh}`"
            )
        return None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class CatalogProvider(Protocol):
    """An ability: offers from a catalog shipped with the plugin, without credentials or
    network."""

    def catalog_offers(self, query: OfferQuery, *, everywhere: bool = False) -> list[Offer]:
        """Offers from the catalog alone, one per (instance type, region, market) with the
        region's zones, spot only when the provider's settings allow spot (what a launch would
        rent); ``everywhere``: in every region the catalog knows (listing a provider that is
        not enabled), else in the regions its settings name."""
        ...

    def catalog_info(self) -> CatalogInfo:
        """Where the catalog in use comes from, and how old it is."""
        ...


PriceSource = Literal["bulk", "api"]
"""Where a refresh reads prices: the public bulk price list, or the cloud's pricing API."""


@runtime_checkable
class CatalogRefresher(Protocol):
    """An ability: the plugin's catalog can be rebuilt from its cloud's price data
    (`gpulayer catalog refresh`)."""

    def refresh_catalog(
        self,
        regions: Iterable[str] | None = None,
        *,
        source: PriceSource = "api",
        on_region: Callable[[str], None] | None = None,
        wait_seconds: float | None = None,
    ) -> Path:
        """Rebuild the catalog for ``regions`` (None: the configured ones) and return where
        it was written; ``on_region`` hears each region as it is read; ``wait_seconds``
        bounds each request."""
        ...


@runtime_checkable
class NamesRegions(Protocol):
    """An ability: the provider's settings name the regions it rents in, so a region there
    is known even where its catalog prices nothing."""

    def configured_regions(self) -> list[str]: ...
