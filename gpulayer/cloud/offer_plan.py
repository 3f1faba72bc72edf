"""What a cloud target would rent for a job, and why not something cheaper. Pure.

The same filter a launch applies (:func:`gpulayer.cloud.ranking.filter_offers_explained`), so a
plan says what a submit would decide: the cheapest offers that fit, with their price per hour
and the job's worst-case cost, and for each offer cheaper than the first fitting one, the first
reason it was turned down.
"""

from __future__ import annotations

from typing import Any

from gpulayer.cloud.offer import Offer, OfferQuery
from gpulayer.cloud.ranking import RankedOffers, filter_offers_explained, format_price
from gpulayer.spec.models import PlacementPolicy

SHOWN_OFFERS = 5
"""Fitting offers a plan lists (the first is what a launch tries first)."""

SHOWN_CHEAPER = 10
"""Cheaper offers turned down that a plan lists with their reason; the rest are counted."""


def worst_case_cost(offer: Offer, timeout_seconds: float | None, nodes: int) -> float | None:
    """The most the job can cost on ``offer``: its price for the whole timeout on each of the
    gang's machines. None when unbounded (no timeout) or the price is unknown."""
    if timeout_seconds is None or offer.hourly_price is None:
        return None
    return offer.hourly_price * timeout_seconds / 3600 * nodes


def _offer_row(offer: Offer, timeout_seconds: float | None, nodes: int) -> dict[str, Any]:
    row = {
        "label": offer.label,
        "provider": offer.provider,
        "region": offer.region,
        "zone": offer.zone,
        "instance_type": offer.instance_type,
        "gpu_name": offer.gpu_name,
        "gpu_count": offer.gpu_count,
        "spot": offer.spot,
        "hourly_price": offer.hourly_price,
        "currency": offer.currency,
        "worst_case_cost": worst_case_cost(offer, timeout_seconds, nodes),
    }
    row["cost"] = describe_cost(row)
    return row


def _cheaper(offer: Offer, than: float | None) -> bool:
    """Whether ``offer`` ranks before a first fitting offer priced ``than`` (None: nothing
    fits, so every offer turned down is one the job could not have)."""
    if than is None:
        return True
    return offer.hourly_price is not None and offer.hourly_price < than


def plan_offers(
    ranked: RankedOffers,
    query: OfferQuery,
    placement: PlacementPolicy,
    *,
    timeout_seconds: float | None,
    nodes: int = 1,
    shown: int = SHOWN_OFFERS,
    cheaper_shown: int = SHOWN_CHEAPER,
) -> dict[str, Any]:
    """The cloud part of a plan: ``offers`` (cheapest fitting first, each with its worst-case
    cost), ``cheaper_rejected`` (offers priced below the first fitting one, with the reason
    each was turned down), the totals, and ``rejected`` (how many offers per reason)."""
    explained = filter_offers_explained(
        ranked,
        query,
        providers=placement.providers,
        regions=placement.regions,
        max_hourly_cost=placement.max_hourly_cost,
        currency=placement.currency,
    )
    fitting = explained.result.offers
    first_price = fitting[0].hourly_price if fitting else None
    cheaper = [(o, why) for o, why in explained.turned_down if _cheaper(o, first_price)]
    return {
        "offers": [_offer_row(o, timeout_seconds, nodes) for o in fitting[:shown]],
        "fitting_total": len(fitting),
        "cheaper_rejected": [
            {**_offer_row(o, timeout_seconds, nodes), "reason": why}
            for o, why in cheaper[:cheaper_shown]
        ],
        "cheaper_rejected_total": len(cheaper),
        "rejected": explained.result.rejected,
        "timeout_seconds": timeout_seconds,
        "nodes": nodes,
    }


def describe_cost(row: dict[str, Any]) -> str:
    """ "21.95764 USD/h, at most 43.91528 USD" or "..., unbounded (no timeout)"."""
    if row["hourly_price"] is None:
        return "unknown price"
    price = f"{format_price(row['hourly_price'])} {row['currency']}/h"
    worst = row["worst_case_cost"]
    if worst is None:
        return f"{price}, worst case unbounded (no timeout_seconds)"
    return f"{price}, worst case {worst:.2f} {row['currency']}"
