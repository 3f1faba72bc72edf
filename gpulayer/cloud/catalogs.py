"""What a provider's shipped catalog says about itself, and when it is too old to trust.

A provider plugin may ship a catalog of what it rents (hardware and prices), so that offers
list without credentials or network. Such a plugin's provider object has two more methods
than the protocol's five:

- ``catalog_offers(query, everywhere=...)`` -> offers from the catalog alone, one per
  (instance type, region, market) with the region's zones, spot only when the provider's
  settings allow spot (so a listing shows what a launch would rent); ``everywhere``: in every
  region the catalog knows (listing a provider that is not enabled), else in the regions its
  settings name;
- ``catalog_info()`` -> :class:`CatalogInfo`.

Pure.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import date
from typing import Any

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


def has_catalog(provider: Any) -> bool:
    return callable(getattr(provider, "catalog_offers", None)) and callable(
        getattr(provider, "catalog_info", None)
    )
