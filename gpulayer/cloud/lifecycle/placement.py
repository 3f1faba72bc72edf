"""What a cloud job could run on now: the fitting offers of the enabled providers, the machines
of other jobs that would fit it (a fixed pool does not offer them while busy), or why nothing
ever can; and where it goes when the cloud cannot take it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpulayer.cloud.lifecycle import gangs, planning

if TYPE_CHECKING:
    from gpulayer.cloud.lifecycle.records import InstanceRecord
    from gpulayer.cloud.offer import Offer
    from gpulayer.spec import JobSpec


@dataclass
class Candidates:
    fitting: list[Offer] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    """"<offer>: in use by job <id>" for other jobs' machines that would fit."""
    freeing: list[str] = field(default_factory=list)
    """Those of ``busy`` that are idle or being torn down: they free within a teardown."""
    warm: list[str] = field(default_factory=list)
    """Request ids of idle (warm) instances that fit the job, cheapest first: it takes one
    of them rather than launching."""
    never: str | None = None
    """Why no offer can ever fit (set only when nothing fits and nothing is busy)."""


def candidates(
    spec: JobSpec,
    providers: Mapping[str, Any],
    live: Iterable[InstanceRecord],
    job_id: str,
    note: Callable[[str], None],
    *,
    wait_seconds: float | None = None,
) -> Candidates:
    from gpulayer.cloud.deadline import DEFAULT_WAIT_SECONDS
    from gpulayer.cloud.offer import Offer, OfferQuery
    from gpulayer.cloud.protocol import GangProvider
    from gpulayer.cloud.ranking import rank
    from gpulayer.cloud.search import gather, select, why_nothing_fits

    placement = spec.placement
    nodes = gangs.nodes_of(spec)
    if nodes > 1:
        # A gang's nodes come from one launch call, which only some providers can make.
        unable = sorted(name for name, p in providers.items() if not isinstance(p, GangProvider))
        providers = {name: p for name, p in providers.items() if isinstance(p, GangProvider)}
        if not providers:
            which = f" ({', '.join(unable)} cannot)" if unable else ""
            return Candidates(
                never=f"num_workers: {nodes} nodes need a provider that launches machines "
                f"together, and none is enabled{which}"
            )
    if not providers:
        return Candidates(never="no cloud provider is installed or enabled")
    # The same pipeline `gpulayer offers` lists with: gather, then select for the placement.
    query = OfferQuery.from_spec(spec)
    wait = wait_seconds or DEFAULT_WAIT_SECONDS
    gathered = gather(providers, query, note=note, wait_seconds=wait)
    ranked = gathered.ranked
    fitting = select(ranked, query, placement)
    holders: dict[planning.OfferKey, list[InstanceRecord]] = {}
    theirs = []
    for record in live:
        # An idle machine is no job's, its last job's included (a retry may take it back).
        if record.offer and (record.job_id != job_id or record.state == "idle"):
            offer = Offer.model_validate(record.offer)
            theirs.append(offer)
            holders.setdefault(planning.offer_key(offer), []).append(record)
    busy: list[str] = []
    freeing: list[str] = []
    warm: list[str] = []
    for offer in select(rank(theirs), query, placement).offers:
        for record in holders.pop(planning.offer_key(offer), []):
            if record.state == "idle" and not _outlasts(record, spec):
                continue  # its provider ends it before the job could end (a time limit)
            if record.state == "idle":
                busy.append(f"{offer.label}: idle, kept warm")
                freeing.append(busy[-1])
                warm.append(record.request_id)
            elif not record.job_id:
                # A fleet's machine being made a worker: idle (and takeable) once it joins.
                busy.append(f"{offer.label}: being made ready for fleet {record.fleet}")
                freeing.append(busy[-1])
            else:
                ending = " (being torn down)" if record.state in gangs.ENDING_OR_GONE else ""
                busy.append(f"{offer.label}: in use by job {record.job_id}{ending}")
                if ending:
                    freeing.append(busy[-1])
    if fitting.offers or busy:
        return Candidates(list(fitting.offers), busy, freeing=freeing, warm=warm)
    # With no offer from anyone, the providers' own failures (a timeout, missing credentials)
    # say more than "no offers at all".
    why = "; ".join(gathered.failed) if not len(ranked) and gathered.failed else None
    why = why or why_nothing_fits(ranked, query, placement, fitting)
    if nodes > 1:
        why = f"{why} (a gang of {nodes} is priced per node: max_hourly_cost caps each machine)"
    return Candidates(never=why)


def _outlasts(record: InstanceRecord, spec: JobSpec) -> bool:
    import datetime as dt

    from gpulayer.cloud.protocol import Instance

    machine = Instance.model_validate(record.machine) if record.machine else None
    now = dt.datetime.now(dt.timezone.utc)
    return machine is None or machine.lasts_for(spec.timeout_seconds, now)


def gang_refusal(
    spec: JobSpec,
    providers: Mapping[str, Any],
    live: Iterable[InstanceRecord],
    *,
    wait_seconds: float | None = None,
) -> str | None:
    """Why no offer could ever take the gang, asked at submit (nothing is rented yet); None
    when one may. An offer search that fails here is left to the reconciler to retry."""
    try:
        found = candidates(spec, providers, live, "", lambda text: None, wait_seconds=wait_seconds)
    except Exception:
        return None
    return found.never


def catalog_refusal(spec: JobSpec, providers: Mapping[str, Any]) -> str | None:
    """Why no offer of the shipped catalogs (no network) could ever take the job, as a launch
    would judge it: the cap (naming the cheapest offer over it), the exact GPU count (naming
    the nearest offer), or the reasons offers were turned down; None when one fits, or when a
    provider has no catalog (its offers cannot be known without asking it)."""
    from gpulayer.cloud.catalogs import CatalogProvider
    from gpulayer.cloud.offer import OfferQuery
    from gpulayer.cloud.ranking import rank
    from gpulayer.cloud.search import select, why_nothing_fits

    placement = spec.placement
    if not providers:
        return None
    catalogs = [p for p in providers.values() if isinstance(p, CatalogProvider)]
    if len(catalogs) < len(providers):
        return None
    query = OfferQuery.from_spec(spec)
    try:
        ranked = rank(o for p in catalogs for o in p.catalog_offers(query))
    except Exception:
        return None  # a catalog that cannot be read refuses nothing; the launch will say
    fitting = select(ranked, query, placement)
    if fitting.offers:
        return None
    return why_nothing_fits(ranked, query, placement, fitting)
