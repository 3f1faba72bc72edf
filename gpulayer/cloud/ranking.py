"""Filter offers down to those a job can use, ranked cheapest first. Pure.

Every rejected offer is counted under the first reason it failed, and each reason names the
query or placement field it comes from, so "no offer fits" can always say why.

The rank order does not depend on the query (fewer surplus GPUs is fewer GPUs when the need is
the same for all offers), and filtering keeps order. So a set of offers is ranked once into
:class:`RankedOffers` and then filtered for each launch attempt without sorting again. For
speed the filter reads a compact row per offer, allocated in rank order, instead of the offer
objects themselves: with 100,000 offers, reading scattered objects costs more than comparing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, NamedTuple, overload

from gpulayer.cloud.errors import Scope, ScopedProviderError
from gpulayer.cloud.offer import Offer, OfferQuery, parse_capability
from gpulayer.hardware.gpus import (
    any_gpu_matches,
    describe_models,
    nominal_memory_gb,
    parse_gpu_name,
)

# Row layout: one tuple per offer, positions below.
_POSITION, _PROVIDER, _REGION, _ZONE, _ACCELERATOR, _GPU_NAME, _GPU_COUNT = range(7)
_GPU_MEMORY, _MEMORY_KIND, _CAPABILITY, _CPU_CORES, _MEMORY, _DISK = range(7, 13)
_OS, _ARCH, _PRICE, _CURRENCY, _SPOT, _GPU_KIND, _GPU_SLICE = range(13, 20)

Row = tuple[Any, ...]
Step = Callable[[list[Row]], list[Row]]


class FilterResult(NamedTuple):
    offers: list[Offer]
    """Offers that fit, cheapest first (see :func:`rank`)."""
    rejected: dict[str, int]
    """How many offers failed, by the first reason each failed."""


class RankedOffers(Sequence[Offer]):
    """A set of offers ranked once: iterates cheapest first (unknown price last), then fewer
    GPUs, then provider, region, zone, instance type, on-demand before spot. Filter it with
    :func:`filter_offers` as often as needed; each filter only scans and never sorts."""

    def __init__(self, offers: Iterable[Offer]) -> None:
        self._ranked = sorted(offers, key=attrgetter("rank_key"))
        capabilities: dict[str | None, tuple[int, int] | None] = {None: None}
        kinds: dict[tuple[str | None, float | None, str | None], tuple[str | None, Any]] = {}
        rows = []
        # Rows are made in rank order, so a filter's survivors come out ranked without a sort
        # and its scan walks memory in the order the rows were allocated.
        for position, o in enumerate(self._ranked):
            cc = o.cuda_compute_capability
            if cc not in capabilities:
                capabilities[cc] = parse_capability(cc)  # type: ignore[arg-type]
            # Memory at the GPU's nominal size, as for workers (an A10G is 24 GB); few
            # distinct GPUs among many offers, so each is worked out once.
            gpu = (o.gpu_name, o.gpu_memory_gb, o.gpu_memory_kind)
            kind = kinds.get(gpu)
            if kind is None:
                memory = (
                    o.gpu_memory_gb
                    if o.gpu_memory_kind == "unified"
                    else nominal_memory_gb(o.gpu_name, o.gpu_memory_gb)
                )
                kind = kinds[gpu] = (o.gpu_name, memory)
            rows.append(
                (
                    position,
                    o.provider,
                    o.region,
                    o.zone,
                    o.accelerator,
                    o.gpu_name,
                    o.gpu_count,
                    kind[1],
                    o.gpu_memory_kind,
                    capabilities[cc],
                    o.cpu_cores,
                    o.memory_gb,
                    o.disk_gb,
                    o.os,
                    o.cpu_arch,
                    o.hourly_price,
                    o.currency,
                    o.spot,
                    kind,
                    o.gpu_slice,
                )
            )
        self._rows = rows

    def __len__(self) -> int:
        return len(self._ranked)

    @overload
    def __getitem__(self, index: int) -> Offer: ...
    @overload
    def __getitem__(self, index: slice) -> list[Offer]: ...
    def __getitem__(self, index: int | slice) -> Offer | list[Offer]:
        return self._ranked[index]

    def __iter__(self) -> Iterator[Offer]:
        return iter(self._ranked)

    def _select(self, rows: list[Row]) -> list[Offer]:
        ranked = self._ranked
        return [ranked[row[_POSITION]] for row in rows]


def rank(offers: Iterable[Offer]) -> RankedOffers:
    """Rank ``offers`` once (a no-op on offers already ranked)."""
    return offers if isinstance(offers, RankedOffers) else RankedOffers(offers)


@dataclass
class BlockList:
    """Places where a launch already failed in a way that later offers there would repeat.

    A capacity error blocks the zone (or region) it names, a quota error its region and an
    auth error the whole provider. Later offers in a blocked place are skipped without a call.
    """

    _providers: dict[str, str] = field(default_factory=dict)
    _regions: dict[tuple[str, str], str] = field(default_factory=dict)
    _zones: dict[tuple[str, str, str], str] = field(default_factory=dict)

    def block(
        self,
        scope: Scope,
        provider: str,
        region: str | None = None,
        zone: str | None = None,
        *,
        kind: str = "error",
    ) -> None:
        if scope == "zone" and region is not None and zone is not None:
            self._zones[(provider, region, zone)] = f"blocked: {kind} in zone {zone}"
        elif scope in ("zone", "region") and region is not None:
            self._regions[(provider, region)] = f"blocked: {kind} in region {region}"
        else:
            self._providers[provider] = f"blocked: {kind} at provider {provider}"

    def record(self, error: ScopedProviderError) -> None:
        provider = error.provider or ""
        self.block(error.scope, provider, error.region, error.zone, kind=error.kind)

    def why(self, provider: str, region: str, zone: str | None) -> str | None:
        """Why that place is blocked, or None when it is not."""
        reason = self._providers.get(provider)
        if reason is None and self._regions:
            reason = self._regions.get((provider, region)) or self._regions.get(
                (provider, outer_region(region))
            )
        if reason is None and self._zones and zone is not None:
            reason = self._zones.get((provider, region, zone))
        return reason

    def reason_for(self, offer: Offer) -> str | None:
        return self.why(offer.provider, offer.region, offer.zone)

    def __len__(self) -> int:
        return len(self._providers) + len(self._regions) + len(self._zones)


# --- steps: each keeps the rows that pass one check, in order --------------------------------
# Written as comprehensions over the row tuples with the bound values closed over, so that no
# Python function is called per row.


def _at_least(k: int, floor: Any) -> Step:
    return lambda rows: [r for r in rows if r[k] is not None and r[k] >= floor]


def _at_most(k: int, ceiling: float) -> Step:
    return lambda rows: [r for r in rows if r[k] is not None and r[k] <= ceiling]


def _equal(k: int, value: object) -> Step:
    return lambda rows: [r for r in rows if r[k] == value]


def _member(k: int, allowed: Iterable[str]) -> Step:
    values = frozenset(allowed)
    return lambda rows: [r for r in rows if r[k] in values]


def outer_region(region: str) -> str:
    """The region a nested one lies in (``lab/gpu``: a Slurm cluster's partition -> ``lab``);
    a region that is not nested is its own."""
    return region.split("/", 1)[0]


def _in_regions(allowed: Iterable[str]) -> Step:
    # Naming a region takes the regions nested in it: a Slurm cluster takes its partitions.
    values = frozenset(allowed)
    return lambda rows: [
        r for r in rows if r[_REGION] in values or outer_region(r[_REGION]) in values
    ]


def _known(k: int) -> Step:
    return lambda rows: [r for r in rows if r[k] is not None]


def _gpu_model(wanted_names: Sequence[str]) -> Step:
    wanted = tuple(parse_gpu_name(name) for name in wanted_names)

    def step(rows: list[Row]) -> list[Row]:
        # Few distinct GPUs among many offers: judge each (name, memory) once.
        kinds = {r[_GPU_KIND] for r in rows}
        hits = {k for k in kinds if any_gpu_matches(wanted, *k)}
        return [r for r in rows if r[_GPU_KIND] in hits]

    return step


def _fixed_disk_at_least(floor: float) -> Step:
    # An offer without a fixed disk gets one sized at launch, so it always fits.
    return lambda rows: [r for r in rows if r[_DISK] is None or r[_DISK] >= floor]


def _priced_in(currency: str) -> Step:
    return lambda rows: [r for r in rows if r[_PRICE] is None or r[_CURRENCY] == currency]


def _hardware_steps(q: OfferQuery) -> list[tuple[str, Step]]:
    """The steps a query implies, only for what it actually asks, most selective first."""
    steps: list[tuple[str, Step]] = []
    if q.accelerator != "cpu":
        steps.append((f"accelerator: not {q.accelerator}", _equal(_ACCELERATOR, q.accelerator)))
    if q.gpu_count and q.gpu_count_exact:
        steps.append(
            (f"gpu_count: not exactly {q.gpu_count} GPUs", _equal(_GPU_COUNT, q.gpu_count))
        )
    elif q.gpu_count:
        steps.append(
            (f"gpu_count: fewer than {q.gpu_count} GPUs", _at_least(_GPU_COUNT, q.gpu_count))
        )
    if q.gpu_count and not q.gpu_slices:
        steps.append(
            (
                "gpu_slices: a slice of one GPU (resources.gpu_slices accepts it)",
                _equal(_GPU_SLICE, None),
            )
        )
    if q.gpu_models:
        models = describe_models([parse_gpu_name(n) for n in q.gpu_models])
        steps.append((f"gpu_models: not {models}", _gpu_model(q.gpu_models)))
    if q.gpu_memory_gb is not None:
        steps.append(
            (
                f"gpu_memory_gb: under {q.gpu_memory_gb:g} GB per GPU or unknown",
                _at_least(_GPU_MEMORY, q.gpu_memory_gb),
            )
        )
    if q.gpu_memory_kind is not None:
        steps.append(
            (
                f"gpu_memory_kind: not {q.gpu_memory_kind}",
                _equal(_MEMORY_KIND, q.gpu_memory_kind),
            )
        )
    if q.min_cuda_compute_capability is not None:
        steps.append(
            (
                f"min_cuda_compute_capability: below {q.min_cuda_compute_capability} or unknown",
                _at_least(_CAPABILITY, parse_capability(q.min_cuda_compute_capability)),
            )
        )
    steps.append((f"cpu_cores: fewer than {q.cpu_cores:g}", _at_least(_CPU_CORES, q.cpu_cores)))
    if q.memory_gb is not None:
        steps.append(
            (f"memory_gb: under {q.memory_gb:g} GB or unknown", _at_least(_MEMORY, q.memory_gb))
        )
    if q.disk_gb is not None:
        steps.append((f"disk_gb: under {q.disk_gb:g} GB", _fixed_disk_at_least(q.disk_gb)))
    if q.os:
        steps.append((f"os: not one of {', '.join(q.os)}", _member(_OS, q.os)))
    if q.cpu_arch:
        steps.append((f"cpu_arch: not one of {', '.join(q.cpu_arch)}", _member(_ARCH, q.cpu_arch)))
    if q.spot is not None:
        label = "spot: spot offers only" if q.spot else "spot: on-demand offers only"
        steps.append((label, _equal(_SPOT, q.spot)))
    return steps


def _placement_steps(
    providers: Sequence[str],
    regions: Sequence[str],
    max_hourly_cost: float | None,
    currency: str,
) -> list[tuple[str, Step]]:
    steps: list[tuple[str, Step]] = []
    if providers:
        steps.append(("providers: not in placement.providers", _member(_PROVIDER, providers)))
    if regions:
        steps.append(("regions: not in placement.regions", _in_regions(regions)))
    # Prices in another currency cannot be compared without a conversion we do not make.
    steps.append((f"currency: priced in another currency than {currency}", _priced_in(currency)))
    if max_hourly_cost is not None:
        steps.append(("max_hourly_cost: no known price", _known(_PRICE)))
        steps.append(
            (
                f"max_hourly_cost: above {max_hourly_cost:g} {currency}/h",
                _at_most(_PRICE, max_hourly_cost),
            )
        )
    return steps


def _unblocked(
    blocked: BlockList,
    rejected: dict[str, int],
    rows: list[Row],
    reasons: dict[int, str] | None = None,
) -> list[Row]:
    kept = []
    for row in rows:
        why = blocked.why(row[_PROVIDER], row[_REGION], row[_ZONE])
        if why is None:
            kept.append(row)
        else:
            rejected[why] = rejected.get(why, 0) + 1
            if reasons is not None:
                reasons[row[_POSITION]] = why
    return kept


def filter_offers(
    offers: Iterable[Offer],
    query: OfferQuery,
    *,
    providers: Sequence[str] = (),
    regions: Sequence[str] = (),
    max_hourly_cost: float | None = None,
    currency: str = "USD",
    blocked: BlockList | None = None,
) -> FilterResult:
    """The offers that satisfy ``query`` and the placement limits, ranked cheapest first.

    ``providers`` and ``regions`` restrict where (empty: anywhere); with ``max_hourly_cost``
    an offer needs a known price not above it, in ``currency``; offers in places ``blocked``
    names are skipped. Pass :class:`RankedOffers` to filter the same offers repeatedly.
    """
    ranked = rank(offers)
    rows, rejected = _filtered_rows(
        ranked, query, providers, regions, max_hourly_cost, currency, blocked, {}, None
    )
    return FilterResult(ranked._select(rows), rejected)


def _filtered_rows(
    ranked: RankedOffers,
    query: OfferQuery,
    providers: Sequence[str],
    regions: Sequence[str],
    max_hourly_cost: float | None,
    currency: str,
    blocked: BlockList | None,
    rejected: dict[str, int],
    reasons: dict[int, str] | None,
) -> tuple[list[Row], dict[str, int]]:
    """The rows that pass every step, and the counts per first failed reason; with
    ``reasons``, also each rejected row's position -> its first failed reason."""
    rows: list[Row] = ranked._rows
    steps = _hardware_steps(query) + _placement_steps(providers, regions, max_hourly_cost, currency)
    for reason, step in steps:
        if not rows:
            break
        kept = step(rows)
        if len(kept) != len(rows):
            rejected[reason] = len(rows) - len(kept)
            if reasons is not None:
                survivors = {row[_POSITION] for row in kept}
                for row in rows:
                    if row[_POSITION] not in survivors:
                        reasons[row[_POSITION]] = reason
        rows = kept
    if blocked and rows:
        rows = _unblocked(blocked, rejected, rows, reasons)
    return rows, rejected


class ExplainedFilter(NamedTuple):
    result: FilterResult
    turned_down: list[tuple[Offer, str]]
    """Every rejected offer with the first reason it failed, in rank order (cheapest first)."""


def filter_offers_explained(
    offers: Iterable[Offer],
    query: OfferQuery,
    *,
    providers: Sequence[str] = (),
    regions: Sequence[str] = (),
    max_hourly_cost: float | None = None,
    currency: str = "USD",
    blocked: BlockList | None = None,
) -> ExplainedFilter:
    """:func:`filter_offers`, and why each offer it turned down was turned down (the same
    steps, so a plan says exactly what a launch would decide)."""
    ranked = rank(offers)
    reasons: dict[int, str] = {}
    rows, rejected = _filtered_rows(
        ranked, query, providers, regions, max_hourly_cost, currency, blocked, {}, reasons
    )
    turned_down = [(ranked[position], reasons[position]) for position in sorted(reasons)]
    return ExplainedFilter(FilterResult(ranked._select(rows), rejected), turned_down)


def cheapest_over_cap(
    offers: Iterable[Offer],
    query: OfferQuery,
    *,
    max_hourly_cost: float,
    providers: Sequence[str] = (),
    regions: Sequence[str] = (),
    currency: str = "USD",
    blocked: BlockList | None = None,
) -> Offer | None:
    """The cheapest priced offer that would fit but for the cap, to say what a job would cost
    when ``max_hourly_cost`` is below every fitting offer. None when nothing fits at any price."""
    fitting, _ = filter_offers(
        offers,
        query,
        providers=providers,
        regions=regions,
        currency=currency,
        blocked=blocked,
    )
    return next(
        (o for o in fitting if o.hourly_price is not None and o.hourly_price > max_hourly_cost),
        None,
    )


def nearest_gpu_count(
    offers: Iterable[Offer],
    query: OfferQuery,
    *,
    max_hourly_cost: float | None = None,
    providers: Sequence[str] = (),
    regions: Sequence[str] = (),
    currency: str = "USD",
    blocked: BlockList | None = None,
) -> Offer | None:
    """When no offer has exactly ``query.gpu_count`` GPUs: the offer that fits every other
    need with the nearest count (more before fewer), on-demand before spot, cheapest among
    those. None when the query asks for no exact count or nothing comes near."""
    if not query.gpu_count or not query.gpu_count_exact:
        return None
    loose = query.model_copy(update={"gpu_count": 1, "gpu_count_exact": False})
    near, _ = filter_offers(
        offers,
        loose,
        providers=providers,
        regions=regions,
        max_hourly_cost=max_hourly_cost,
        currency=currency,
        blocked=blocked,
    )
    want = query.gpu_count
    return min(
        near,
        key=lambda o: (abs(o.gpu_count - want), o.gpu_count < want, o.spot, *o.rank_key),
        default=None,
    )


def describe_no_exact_fit(query: OfferQuery, nearest: Offer, providers: Sequence[str]) -> str:
    """ "no aws offer has exactly 1 A100; p4d.24xlarge has 8 at 21.96 USD/h"."""
    where = " or ".join(providers) if providers else nearest.provider
    models = describe_models([parse_gpu_name(n) for n in query.gpu_models])
    what = models or ("GPU" if query.gpu_count == 1 else "GPUs")
    price = (
        "an unknown price"
        if nearest.hourly_price is None
        else f"{format_price(nearest.hourly_price)} {nearest.currency}/h"
    )
    return (
        f"no {where} offer has exactly {query.gpu_count} {what}; "
        f"{nearest.instance_type} has {nearest.gpu_count} at {price}"
    )


def format_price(price: float) -> str:
    """Every significant digit, never an exponent: 21.957642, 0.526, 1e-05 -> 0.00001."""
    text = repr(float(price))
    if "e" in text or "E" in text:
        text = f"{price:.12f}".rstrip("0").rstrip(".")
    return text.removesuffix(".0")


def describe_rejections(rejected: dict[str, int]) -> str:
    """One line, most common reason first: "12 offers: gpu_count: fewer than 8 GPUs; ..."."""
    ordered = sorted(rejected.items(), key=lambda item: (-item[1], item[0]))
    return "; ".join(f"{count} offers: {reason}" for reason, count in ordered)
