"""Renting cloud instances for jobs: the provider protocol and its plugin registry, offers and
their ranking. Pure except :mod:`gpulayer.cloud.registry` (reads installed metadata) and
:mod:`gpulayer.cloud.cache` (files); no cloud SDK is imported here."""

from gpulayer.cloud.errors import (
    AuthError,
    CapacityError,
    ImageNotFoundError,
    ProviderError,
    ProviderNotInstalled,
    ProviderSettingsError,
    ProvisionTimeout,
    QuotaError,
    ScopedProviderError,
)
from gpulayer.cloud.offer import Offer, OfferQuery
from gpulayer.cloud.protocol import Instance, InstanceState, LaunchRequest, Provider
from gpulayer.cloud.ranking import BlockList, FilterResult, cheapest_over_cap, filter_offers, rank
from gpulayer.cloud.registry import available_providers, get_provider

__all__ = [
    "AuthError",
    "BlockList",
    "CapacityError",
    "FilterResult",
    "ImageNotFoundError",
    "Instance",
    "InstanceState",
    "LaunchRequest",
    "Offer",
    "OfferQuery",
    "Provider",
    "ProviderError",
    "ProviderNotInstalled",
    "ProviderSettingsError",
    "ProvisionTimeout",
    "QuotaError",
    "ScopedProviderError",
    "available_providers",
    "cheapest_over_cap",
    "filter_offers",
    "get_provider",
    "rank",
]
