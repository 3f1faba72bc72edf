"""Renting cloud instances for jobs: the provider protocol and its plugin registry, offers and
their ranking. Pure except :mod:`gpulayer.cloud.registry` (reads installed metadata) and
:mod:`gpulayer.cloud.cache` (files); no cloud SDK is imported here.

Names are loaded on first use, so importing one small module of the package (the GPU facts of
:mod:`gpulayer.cloud.gpus`, which workers read) does not load the rest.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AuthError": "errors",
    "CapacityError": "errors",
    "ImageNotFoundError": "errors",
    "ProviderError": "errors",
    "ProviderNotInstalled": "errors",
    "ProviderSettingsError": "errors",
    "ProvisionTimeout": "errors",
    "QuotaError": "errors",
    "ScopedProviderError": "errors",
    "Offer": "offer",
    "OfferQuery": "offer",
    "GangProvider": "protocol",
    "Instance": "protocol",
    "InstanceState": "protocol",
    "LaunchRequest": "protocol",
    "Provider": "protocol",
    "can_launch_gangs": "protocol",
    "node_install_dir": "protocol",
    "BlockList": "ranking",
    "FilterResult": "ranking",
    "cheapest_over_cap": "ranking",
    "filter_offers": "ranking",
    "rank": "ranking",
    "available_providers": "registry",
    "get_provider": "registry",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
