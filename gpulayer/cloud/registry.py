"""Find provider plugins through the entry-point group ``gpulayer.providers``.

Listing reads installed metadata only; a plugin's module is imported when it is asked for by
name, and plugins import their cloud SDK only when a verb needs it, so neither listing nor
constructing a provider costs SDK import time. A loaded plugin is checked against the abilities
it declares (:mod:`gpulayer.cloud.contract`) before anything is built with it. A control plane
keeps what it built in a :class:`gpulayer.cloud.provider_registry.ProviderRegistry`.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, ClassVar, Protocol, runtime_checkable

from gpulayer.cloud.catalogs import CatalogRefresher
from gpulayer.cloud.errors import ProviderNotInstalled
from gpulayer.cloud.protocol import Provider
from gpulayer.errors import UsageError

ENTRY_POINT_GROUP = "gpulayer.providers"


@runtime_checkable
class HasSettingsModel(Protocol):
    """A plugin factory (its class) that says what its settings section validates into."""

    settings_model: ClassVar[Any]


def _entry_points() -> dict[str, EntryPoint]:
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        # Two distributions claiming one name: the first wins, as importlib orders them.
        found.setdefault(ep.name, ep)
    return found


def available_providers() -> list[str]:
    """Names of the installed provider plugins, sorted."""
    return sorted(_entry_points())


def _factory(ep: EntryPoint) -> Any:
    """The plugin's factory, its declared abilities checked when it is a class."""
    from gpulayer.cloud.contract import check_plugin_class

    factory = ep.load()
    if isinstance(factory, type):
        check_plugin_class(factory, _where(ep))
    return factory


def _where(ep: EntryPoint) -> str:
    return f"provider {ep.name!r} ({ep.value})"


def settings_model(name: str) -> Any:
    """The pydantic model of a provider's settings (its factory's ``settings_model``), or None
    when the plugin is not installed or does not say. A plugin that is not what it declares
    raises ProviderContractError."""
    ep = _entry_points().get(name)
    if ep is None:
        return None
    try:
        factory = _factory(ep)
    except ImportError:
        return None
    return factory.settings_model if isinstance(factory, HasSettingsModel) else None


def factory_has(name: str, attribute: str) -> bool:
    """Whether the installed plugin's factory has ``attribute`` (an optional ability), known
    without constructing it; False when it is not installed or cannot be imported."""
    ep = _entry_points().get(name)
    if ep is None:
        return False
    try:
        return hasattr(_factory(ep), attribute)
    except ImportError:
        return False


def get_provider(name: str, settings: Mapping[str, Any] | None = None) -> Provider:
    """Construct the provider registered as ``name`` with its settings mapping."""
    from gpulayer.cloud.contract import check_plugin_class

    eps = _entry_points()
    ep = eps.get(name)
    if ep is None:
        from gpulayer.cloud.install_hint import not_installed_line

        raise ProviderNotInstalled(not_installed_line(name, eps))
    try:
        factory = _factory(ep)
    except ImportError as exc:
        raise ProviderNotInstalled(_not_imported(name, ep, exc)) from exc
    provider = factory(dict(settings or {}))
    check_plugin_class(type(provider), _where(ep))  # a factory function's product, too
    if not isinstance(provider, Provider):
        raise ProviderNotInstalled(
            f"{_where(ep)} does not build a gpulayer provider "
            "(it lacks name/offers/launch/describe/terminate/list_owned)"
        )
    return provider


def _not_imported(name: str, ep: EntryPoint, exc: ImportError) -> str:
    from gpulayer.cloud.installed import installed_after_start

    line = f"provider {name!r} is installed but does not import: {exc}"
    if installed_after_start(ep):
        # An editable install's import hook, say, is set up only as an interpreter starts.
        line += (
            "; it was installed after the control plane started: restart it (a team server: "
            "start `gpulayer server` again; this machine's: `gpulayer server stop`)"
        )
    return line


def catalog_refresher(name: str, settings: Mapping[str, Any] | None = None) -> CatalogRefresher:
    """The provider ``name`` as one whose price catalog can be rebuilt; UsageError when it
    cannot."""
    provider = get_provider(name, settings)
    if not isinstance(provider, CatalogRefresher):
        raise UsageError(f"PROVIDER: {name} has no price catalog to refresh")
    return provider
