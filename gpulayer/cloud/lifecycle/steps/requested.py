"""The record of a machine about to be asked for: written before the provider's call, whether
a job's (one node, a gang's node, an array's task) or a fleet's."""

from __future__ import annotations

from typing import Any

from gpulayer.cloud.offer import Offer


def requested_row(
    offer: Offer,
    *,
    request_id: str,
    job_id: str,
    owner: str,
    key_path: str,
    tags: dict[str, str],
    **extra: Any,
) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "job_id": job_id,
        "owner": owner,
        "provider": offer.provider,
        "region": offer.region,
        "zone": offer.zone,
        "instance_type": offer.instance_type,
        "state": "requested",
        "key_path": key_path,
        "hourly_price": offer.hourly_price,
        "currency": offer.currency,
        "spot": offer.spot,
        "tags": tags,
        "offer": offer.model_dump(mode="json"),
        **extra,
    }
