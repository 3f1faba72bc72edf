"""Find provider plugins through the entry-point group ``gpulayer.providers``.

Listing reads installed metadata only; a plugin's module is imported when it is asked for by
name, and plugins import their cloud SDK only when a verb needs it, so neither listing nor
constructing a provider costs SDK import time.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from gpulayer.cloud.errors import ProviderNotInstalled
from gpulayer.cloud.protocol import Provider

ENTRY_POINT_GROUP = "gpulayer.providers"


def _entry_points() -> dict[str, EntryPoint]:
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        # Two distributions claiming one name: the first wins, as importlib orders them.
        found.setdefault(ep.name, ep)
    return found


def available_providers() -> list[str]:
    """Names of the installed provider plugins, sorted."""
    return sorted(_entry_points())


def settings_model(name: str) -> Any:
    """The pydantic model of a provider's settings (its factory's ``settings_model``), or None
    when the plugin is not installed or does not say."""
    ep = _entry_points().get(name)
    if ep is None:
        return None
    try:
        factory = ep.load()
    except ImportError:
        return None
    return getattr(factory, "settings_model", None)


def get_provider(name: str, settings: Mapping[str, Any] | None = None) -> Provider:
    """Construct the provider registered as ``name`` with its settings mapping."""
    eps = _entry_points()
    ep = eps.get(name)
    if ep is None:
        from gpulayer.cloud.install_hint import not_installed_line

        raise ProviderNotInstalled(not_installed_line(name, eps))
    try:
        factory = ep.load()
    except ImportError as exc:
        raise ProviderNotInstalled(
            f"provider {name!r} is installed but does not import: {exc}"
        ) from exc
    provider = factory(dict(settings or {}))
    if not isinstance(provider, Provider):
        raise ProviderNotInstalled(
            f"provider {name!r}: {ep.value} does not build a gpulayer provider "
            "(it lacks offers/launch/describe/terminate/list_owned)"
        )
    return provider
