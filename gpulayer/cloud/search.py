"""The one offer pipeline: gather offers from providers, rank them once, filter them with a
job's needs and placement, and say why when nothing fits.

The provisioner (a submitted cloud job) and the control plane's offers route (`gpulayer
offers`) both go through here, so what `offers` lists is what `submit` would rent, in the same
order. Listing differs only in what it may show besides: offers of providers that are not
enabled (from their shipped catalogs, marked so) and catalog offers of an enabled provider
whose live API cannot be reached.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpulayer.cloud.catalogs import CatalogInfo, CatalogProvider, NamesRegions
from gpulayer.cloud.deadline import DEFAULT_WAIT_SECONDS, call_each_within
from gpulayer.cloud.errors import ProviderError
from gpulayer.cloud.offer import Offer, OfferQuery
from gpulayer.cloud.ranking import (
    BlockList,
    FilterResult,
    RankedOffers,
    cheapest_over_cap,
    describe_no_exact_fit,
    describe_rejections,
    filter_offers,
    format_price,
    nearest_gpu_count,
    rank,
)
from gpulayer.errors import GpulayerError, UsageError
from gpulayer.spec.models import JobSpec, PlacementPolicy

log = logging.getLogger("gpulayer.offers")

Note = Callable[[str], None]


@dataclass
class Gathered:
    """Offers from several providers, ranked once, and what was learned getting them."""

    ranked: RankedOffers
    sources: dict[str, str] = field(default_factory=dict)
    """Provider -> "live" (its API) or "catalog" (its shipped catalog)."""
    enabled: frozenset[str] = frozenset()
    """Providers whose offers a job may rent (listed in providers.yaml and installed)."""
    notes: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    """One line per provider whose offers could not be had (its notes among ``notes``)."""
    catalogs: list[CatalogInfo] = field(default_factory=list)


def gather(
    enabled: Mapping[str, Any],
    query: OfferQuery,
    *,
    disabled: Mapping[str, Any] | None = None,
    catalog_fallback: bool = False,
    note: Note | None = None,
    wait_seconds: float = DEFAULT_WAIT_SECONDS,
) -> Gathered:
    """Offers of the ``enabled`` providers (name -> provider object) for ``query``.

    ``catalog_fallback``: when a provider's API fails, list its catalog's offers instead of
    none (for listing; a launch needs the API anyway). ``disabled`` providers contribute
    their catalogs' offers in every region, for listing only. The enabled providers are
    asked side by side, and one that has not answered within ``wait_seconds`` counts as
    failed (:class:`~gpulayer.cloud.deadline.CloudWaitTimeout`)."""
    notes: list[str] = []
    failed: list[str] = []

    def say(text: str) -> None:
        notes.append(text)
        if note is not None:
            note(text)

    offers: list[Offer] = []
    sources: dict[str, str] = {}
    catalogs: dict[str, CatalogInfo] = {}
    answers = call_each_within(
        {name: _offers_of(provider, query) for name, provider in enabled.items()},
        wait_seconds,
        "listing offers",
        on_slow=_slow_note(note, wait_seconds),
    )
    for name, provider in enabled.items():
        try:
            answer = answers[name]
            if isinstance(answer, BaseException):
                raise answer
            found = answer
            sources[name] = "live"
        except ProviderError as exc:
            if not (catalog_fallback and isinstance(provider, CatalogProvider)):
                failed.append(f"{name}: no offers ({exc})")
                say(failed[-1])
                continue
            found = provider.catalog_offers(query, everywhere=False)
            catalogs[name] = provider.catalog_info()
            sources[name] = "catalog"
            say(f"{name}: live offers unavailable ({exc}); listing its catalog")
        offers.extend(found)
        if isinstance(provider, CatalogProvider) and name not in catalogs:
            catalogs[name] = provider.catalog_info()
    for name, provider in (disabled or {}).items():
        if not isinstance(provider, CatalogProvider):
            continue
        offers.extend(provider.catalog_offers(query, everywhere=True))
        catalogs[name] = provider.catalog_info()
        sources[name] = "catalog"
    for info in catalogs.values():
        stale = info.stale_note()
        if stale:
            say(stale)
    return Gathered(
        ranked=rank(offers),
        sources=sources,
        enabled=frozenset(enabled),
        notes=notes,
        failed=failed,
        catalogs=list(catalogs.values()),
    )


def _slow_note(note: Note | None, wait_seconds: float) -> Callable[[list[str]], None] | None:
    """What a job's log says while its offer search waits on providers."""
    if note is None:
        return None
    told = note

    def tell(pending: list[str]) -> None:
        names = ", ".join(pending)
        told(f"waiting for {names} to list offers (given up after {wait_seconds:g} s)")

    return tell


def _offers_of(provider: Any, query: OfferQuery) -> Callable[[], list[Offer]]:
    return lambda: list(provider.offers(query))


def select(
    ranked: RankedOffers,
    query: OfferQuery,
    placement: PlacementPolicy,
    *,
    blocked: BlockList | None = None,
) -> FilterResult:
    """The offers a job with ``placement`` may rent, cheapest first."""
    return filter_offers(
        ranked,
        query,
        providers=placement.providers,
        regions=placement.regions,
        max_hourly_cost=placement.max_hourly_cost,
        currency=placement.currency,
        blocked=blocked,
    )


def why_nothing_fits(
    ranked: RankedOffers, query: OfferQuery, placement: PlacementPolicy, result: FilterResult
) -> str:
    """One line on why ``result`` is empty: the cap (naming the cheapest offer over it), the
    exact GPU count (naming the nearest offer), or the reasons offers were turned down."""
    if not len(ranked):
        return "no offers at all"
    limits: dict[str, Any] = {
        "providers": placement.providers,
        "regions": placement.regions,
        "currency": placement.currency,
    }
    if placement.max_hourly_cost is not None:
        over = cheapest_over_cap(ranked, query, max_hourly_cost=placement.max_hourly_cost, **limits)
        if over is not None and over.hourly_price is not None:
            cap = f"{format_price(placement.max_hourly_cost)} {placement.currency}"
            return (
                f"max_hourly_cost {cap} is below every offer that fits; the cheapest is "
                f"{over.label} at {format_price(over.hourly_price)} {over.currency}/h"
            )
    nearest = nearest_gpu_count(ranked, query, max_hourly_cost=placement.max_hourly_cost, **limits)
    if nearest is not None:
        return describe_no_exact_fit(query, nearest, placement.providers)
    return "no offer fits: " + (describe_rejections(result.rejected) or "no offers at all")


# --- listing: `gpulayer offers` through the control plane -------------------------------------


def enable_hint(name: str, providers_file: Path, *, one_line: bool = True) -> str:
    """The line that enables a provider; one whose offers are what the user lists (ssh hosts)
    needs its section filled in."""
    if one_line:
        return f"add `{name}: {{}}` to {providers_file} to enable {name}"
    return f"add the `{name}:` section to {providers_file} to enable {name}"


def _disabled_providers(names: Sequence[str]) -> dict[str, Any]:
    """Providers not in providers.yaml, built with their default settings to list their
    catalogs; one that needs settings to be built at all (ssh: its hosts) is skipped."""
    from gpulayer.cloud.registry import get_provider

    built = {}
    for name in names:
        try:
            built[name] = get_provider(name, {})
        except GpulayerError:
            continue  # nothing to list without its settings; the enable note says what to do
    return built


def _unknown_provider(name: str, installed: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, installed, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    known = ", ".join(installed) or "none"
    return f"{name!r} is not an installed provider{hint} (installed: {known})"


# How list_offers names each field it checks, unless its caller spells them otherwise (the CLI
# names its flags: --gpu, --region, --provider).
FIELD_NAMES: Mapping[str, str] = {
    "gpu_models": "resources.gpu_models",
    "regions": "placement.regions",
    "providers": "placement.providers",
}


def _closest(found: Sequence[str]) -> str:
    return f"; closest: {', '.join(found)}" if found else ""


def check_gpu_models(models: Sequence[str], name: str) -> None:
    """A UsageError for a GPU name that is not in the GPU table: it could match no offer."""
    from gpulayer.hardware.gpus import closest_models, is_known_model

    for model in models:
        if not is_known_model(model):
            hint = _closest(closest_models(model))
            raise UsageError(f"{name}: {model!r} is not a GPU model gpulayer knows{hint}")


def known_regions(providers: Mapping[str, Any]) -> set[str] | None:
    """Every region the providers' catalogs price or their settings name; None when one of
    them has no catalog (its regions cannot be known without asking it)."""
    regions: set[str] = set()
    for provider in providers.values():
        if not isinstance(provider, CatalogProvider):
            return None
        for accelerator in ("cpu", "cuda"):
            query = OfferQuery(accelerator=accelerator, gpu_count_exact=False)
            regions |= {o.region for o in provider.catalog_offers(query, everywhere=True)}
        if isinstance(provider, NamesRegions):
            regions |= set(provider.configured_regions())
    return regions


def check_regions(wanted: Sequence[str], providers: Mapping[str, Any], name: str) -> None:
    known = known_regions(providers) if wanted else None
    if not known:
        return
    for region in wanted:
        if region not in known:
            close = difflib.get_close_matches(region, sorted(known), n=3, cutoff=0.6)
            where = ", ".join(sorted(providers))
            raise UsageError(
                f"{name}: {region!r} is not a region of {where}{_closest(close)} "
                f"({len(known)} known)"
            )


def list_offers(
    root: Path,
    spec: JobSpec,
    *,
    gpu_count_exact: bool = True,
    include_disabled: bool = True,
    limit: int = 30,
    names: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """What `gpulayer offers` shows: the offers ``spec`` fits, ranked as submit ranks them,
    each marked with whether its provider is enabled; notes saying why when none is listed.

    ``limit`` 0: every offer. A GPU model, region or provider no offer could have is a
    UsageError naming the closest known names, under the field's name in ``names`` (else
    FIELD_NAMES), before any provider is asked."""
    from gpulayer.cloud.config import orchestrator_section, provider_settings, providers_file
    from gpulayer.cloud.installed import installed_key
    from gpulayer.cloud.registry import available_providers, get_provider

    installed_key()  # a plugin installed since this process last looked is imported afresh
    named = {**FIELD_NAMES, **(names or {})}
    installed = available_providers()
    wanted = list(spec.placement.providers)
    for name in wanted:
        if name not in installed:
            raise UsageError(f"{named['providers']}: " + _unknown_provider(name, installed))
    check_gpu_models(spec.resources.gpu_models, named["gpu_models"])
    configured = provider_settings(root)
    path = providers_file(root)
    chosen = [n for n in installed if not wanted or n in wanted]
    enabled = {n: get_provider(n, configured[n]) for n in chosen if n in configured}
    notes = [
        f"{path}: " + _unknown_provider(n, installed)
        for n in configured
        if n not in installed and (not wanted or n in wanted)
    ]
    unconfigured = [n for n in chosen if n not in configured]
    buildable = _disabled_providers(unconfigured)
    check_regions(spec.placement.regions, {**enabled, **buildable}, named["regions"])
    disabled = buildable if include_disabled else {}
    query = OfferQuery.from_spec(spec, gpu_count_exact=gpu_count_exact)
    wait = float(orchestrator_section(root)["cloud_wait_seconds"])
    gathered = gather(enabled, query, disabled=disabled, catalog_fallback=True, wait_seconds=wait)
    result = select(gathered.ranked, query, spec.placement)
    notes += gathered.notes
    hints = [
        enable_hint(n, path, one_line=isinstance(disabled.get(n), CatalogProvider))
        for n in unconfigured
    ]
    if not configured:
        notes.append(f"no provider is enabled: {path} lists none; " + "; ".join(hints))
    else:
        pairs = zip(unconfigured, hints, strict=True)
        notes += [f"{name} is not enabled: {hint}" for name, hint in pairs]
    if not result.offers:
        notes.append(why_nothing_fits(gathered.ranked, query, spec.placement, result))
    # What submit would rent comes first, in submit's order; then what enabling would add.
    rentable = [o for o in result.offers if o.provider in gathered.enabled]
    listed_only = [o for o in result.offers if o.provider not in gathered.enabled]
    rows = []
    for offer in (rentable + listed_only)[: limit or None]:
        row = offer.model_dump(mode="json")
        row["enabled"] = offer.provider in gathered.enabled
        row["source"] = gathered.sources.get(offer.provider, "live")
        rows.append(row)
    return {
        "offers": rows,
        "total": len(result.offers),
        "rejected": result.rejected,
        "notes": notes,
        "catalogs": [c.to_json() for c in gathered.catalogs],
        "providers_file": str(path),
    }


# --- planning: `gpulayer plan` ------------------------------------------------------------------


def plan_cloud(
    spec: JobSpec,
    providers: Mapping[str, Any],
    *,
    nodes: int = 1,
    wait_seconds: float = DEFAULT_WAIT_SECONDS,
) -> dict[str, Any]:
    """What the cloud target would rent for ``spec`` (a gang of ``nodes`` machines) from the
    enabled ``providers`` (see :func:`gpulayer.cloud.offer_plan.plan_offers`), read as
    `gpulayer offers` reads them: a provider whose API cannot be reached is planned from its
    catalog, and a note says so."""
    from gpulayer.cloud.offer_plan import plan_offers

    query = OfferQuery.from_spec(spec)
    gathered = gather(providers, query, catalog_fallback=True, wait_seconds=wait_seconds)
    planned = plan_offers(
        gathered.ranked,
        query,
        spec.placement,
        timeout_seconds=spec.timeout_seconds,
        nodes=nodes,
    )
    planned["providers"] = sorted(providers)
    planned["cpu_arch"] = list(query.cpu_arch)
    planned["cpu_arch_from"] = "job" if spec.resources.cpu_arch else "submitting machine"
    planned["sources"] = gathered.sources
    planned["notes"] = list(gathered.notes)
    if not planned["offers"]:
        empty = FilterResult([], planned["rejected"])
        planned["notes"].append(why_nothing_fits(gathered.ranked, query, spec.placement, empty))
    return planned
