"""Which offer a cloud job tries next, from what its earlier instances went through. Pure.

Every try is an instance record whose outcome columns say what it ended in, so the choice
survives a controller restart: a launch the provider refused for capacity blocks its place for
a backoff (or until capacity frees), a quota or credentials refusal blocks its region or
provider, an offer that failed otherwise (SSH, bootstrap) is not tried again for this job, and
a reclaimed machine's offer is held for every job for a while. When nothing is left, the job
either waits for capacity or gives up, and the decision says why in one line.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from gpulayer.backoff import CLOUD_CAPACITY_RETRY
from gpulayer.cloud.errors import SCOPES, Scope
from gpulayer.cloud.offer import Offer
from gpulayer.cloud.ranking import BlockList

OfferKey = tuple[str, str, str, str, bool]
Outcome = Literal["capacity", "quota", "auth", "config", "failed", "partial", "reclaimed", "other"]
OUTCOMES: frozenset[str] = frozenset(
    {"capacity", "quota", "auth", "config", "failed", "partial", "reclaimed"}
)

REFUSALS: tuple[str, ...] = ("capacity", "quota", "auth")
CONFIG_TRIES_PER_PROVIDER = 2
"""A configuration error repeats on every offer of its provider: one more try (it may be one
region's, such as an image missing there), then none."""


def offer_key(offer: Offer | Mapping[str, Any]) -> OfferKey:
    data = offer.model_dump() if isinstance(offer, Offer) else offer
    return (
        str(data["provider"]),
        str(data["region"]),
        str(data.get("zone") or ""),
        str(data["instance_type"]),
        bool(data.get("spot", False)),
    )


@dataclass(frozen=True)
class TryEnd:
    """What a try ended in. Written to the instance's outcome columns in the same write as
    the move that ends it; the next choice reads those columns, and a later step's failure
    (a terminate) goes to a column of its own, so it never hides what the try ended in."""

    outcome: Outcome
    scope: Scope | None
    message: str

    @property
    def note(self) -> str:
        """The record's note, for people: `capacity/zone: ...`, `failed: ...`."""
        head = f"{self.outcome}/{self.scope}" if self.scope else self.outcome
        return f"{head}: {self.message}"

    def columns(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "outcome_scope": self.scope,
            "outcome_message": self.message,
            "note": self.note,
        }


def refused(kind: str, scope: Scope, message: str) -> TryEnd:
    """The provider refused the launch (capacity, quota, auth) for a place."""
    if kind not in REFUSALS:
        raise ValueError(f"not a refusal: {kind!r}")
    return TryEnd(kind, scope, message)  # type: ignore[arg-type]


def partial(scope: Scope, message: str) -> TryEnd:
    """A gang of which some nodes came up and one did not: all were torn down, and its
    place is not tried again for the job."""
    return TryEnd("partial", scope, message)


def failed(message: str) -> TryEnd:
    return TryEnd("failed", None, message)


def misconfigured(message: str) -> TryEnd:
    return TryEnd("config", None, message)


class TryRecord(Protocol):
    """An instance record as the choice reads it (the control plane's InstanceRecord)."""

    job_id: str
    offer: dict[str, Any] | None
    outcome: str | None
    outcome_scope: str | None
    outcome_message: str | None
    hold_until: float | None
    created_at: float
    ended_at: float | None


@dataclass(frozen=True)
class PastTry:
    key: OfferKey
    label: str
    outcome: Outcome
    scope: Scope | None
    message: str
    created_at: float
    ended_at: float | None


def past_try(record: TryRecord) -> PastTry | None:
    """One earlier instance of the job as a try; None for records without an offer. A try
    with no recorded fault (it ran, or still runs) is "other"."""
    if not record.offer:
        return None
    key = offer_key(record.offer)
    outcome = record.outcome if record.outcome in OUTCOMES else "other"
    scope = record.outcome_scope if record.outcome_scope in SCOPES else None
    return PastTry(
        key,
        key_label(key),
        outcome,  # type: ignore[arg-type]
        scope,
        record.outcome_message or "",
        record.created_at,
        record.ended_at,
    )


def tries_of(records: Iterable[TryRecord]) -> list[PastTry]:
    return [t for t in (past_try(r) for r in records) if t is not None]


def held_offers(records: Iterable[TryRecord], now: float) -> dict[OfferKey, str]:
    """Offers held for every job (a spot machine just reclaimed), with why, from the tries
    that hold them: they are in the store, so a restarted controller holds them too."""
    held: dict[OfferKey, str] = {}
    for record in records:
        if record.offer and record.hold_until is not None and record.hold_until > now:
            held[offer_key(record.offer)] = f"reclaimed from job {record.job_id}"
    return held


@dataclass(frozen=True)
class Decision:
    offer: Offer | None = None
    wait: str | None = None
    """Why the job waits for capacity (it stays queued and is looked at again later)."""
    give_up: str | None = None
    retry_in: float | None = None


def backoff_seconds(capacity_tries: int) -> float:
    return CLOUD_CAPACITY_RETRY.delay(capacity_tries)


def choose(
    fitting: Sequence[Offer],
    tries: Iterable[PastTry],
    *,
    now: float,
    capacity_freed_at: float = 0.0,
    held_offers: Mapping[OfferKey, str] | None = None,
    busy: Sequence[str] = (),
    freeing: Sequence[str] = (),
    queue: bool = True,
    wait_limit: float | None = None,
    wait_started: float | None = None,
) -> Decision:
    """The next offer to launch for a job, or why it waits, or why it gives up.

    ``held_offers`` are offers blocked for every job for a while (a spot offer just
    reclaimed), with why; ``busy`` says which machines that would fit are in use by other
    jobs (an ssh pool does not offer them), and ``freeing`` those of them that are idle or
    being torn down: the job waits for those even when it does not queue, as they free within
    a teardown; ``capacity_freed_at`` is when an instance last
    ended, which ends every capacity block from before it; ``wait_limit`` bounds the whole
    wait for capacity, counted from ``wait_started`` (or the first capacity refusal)."""
    tries = list(tries)
    held = dict(held_offers or {})
    capacity = [t for t in tries if t.outcome == "capacity"]
    backoff = backoff_seconds(len(capacity))
    blocked = BlockList()
    waiting = _block_refusals(blocked, tries, now, capacity_freed_at, backoff)
    _block_partial_gangs(blocked, tries)
    _block_misconfigured_providers(blocked, tries)
    offer = _first_open(fitting, tries, held, blocked)
    if offer is not None:
        return Decision(offer=offer)
    waiting += [f"{key_label(k)}: {why}" for k, why in held.items() if _fits(k, fitting)]
    waiting += list(busy)
    if not waiting:
        return _every_offer_failed(tries)
    started = min([t.created_at for t in capacity] + [wait_started or now])
    return _wait_or_give_up(
        list(dict.fromkeys(waiting)),
        queue=queue or bool(freeing),
        waited=now - started,
        wait_limit=wait_limit,
        backoff=backoff,
    )


def _place(past: PastTry) -> tuple[str, str, str | None]:
    return past.key[0], past.key[1], past.key[2] or None


def _block_refusals(
    blocked: BlockList, tries: Sequence[PastTry], now: float, freed_at: float, backoff: float
) -> list[str]:
    """Block the places that refused; the capacity refusals still in force, as reasons to
    wait. A capacity refusal older than the backoff, or than the last instance's end, no
    longer blocks: capacity may be back there."""
    waiting: list[str] = []
    for past in tries:
        if past.outcome not in REFUSALS or past.scope is None:
            continue
        ended = past.ended_at or past.created_at
        if past.outcome == "capacity" and (ended < freed_at or now - ended > backoff):
            continue
        blocked.block(past.scope, *_place(past), kind=past.outcome)
        if past.outcome == "capacity":
            waiting.append(f"{past.label}: {past.message}")
    return waiting


def _block_partial_gangs(blocked: BlockList, tries: Sequence[PastTry]) -> None:
    for past in tries:
        if past.outcome == "partial" and past.scope is not None:
            blocked.block(past.scope, *_place(past), kind="partial gang launch")


def _block_misconfigured_providers(blocked: BlockList, tries: Sequence[PastTry]) -> None:
    errors = Counter(past.key[0] for past in tries if past.outcome == "config")
    for provider, count in errors.items():
        if count >= CONFIG_TRIES_PER_PROVIDER:
            blocked.block("provider", provider, kind="configuration error")


def _first_open(
    fitting: Sequence[Offer],
    tries: Sequence[PastTry],
    held: Mapping[OfferKey, str],
    blocked: BlockList,
) -> Offer | None:
    """The first fitting offer (the cheapest) that failed for the job in no try, is not held,
    and is in no blocked place."""
    failed = {t.key for t in tries if t.outcome in ("failed", "config")}
    for offer in fitting:
        key = offer_key(offer)
        if key not in failed and key not in held and blocked.reason_for(offer) is None:
            return offer
    return None


def _wait_or_give_up(
    waiting: list[str],
    *,
    queue: bool,
    waited: float,
    wait_limit: float | None,
    backoff: float,
) -> Decision:
    """Offers that would fit are busy or out of capacity: the job waits, unless it does not
    queue or has waited its provisioning_timeout_seconds."""
    shown = "; ".join(waiting[:3]) + ("; ..." if len(waiting) > 3 else "")
    what = f"{len(waiting)} offer(s) busy or out of capacity ({shown})"
    if not queue:
        return Decision(give_up=f"no capacity: {what}")
    if wait_limit is not None and waited > wait_limit:
        return Decision(
            give_up=f"no capacity within provisioning_timeout_seconds ({wait_limit:g} s): " + shown
        )
    return Decision(wait=f"waiting for capacity: {what}", retry_in=backoff)


FREEING_RETRY_SECONDS = 2.0
"""How soon a job waiting for machines that are idle or being torn down is planned again."""


def _every_offer_failed(tries: Sequence[PastTry]) -> Decision:
    messages = [f"{t.label}: {t.message}" for t in tries if t.outcome != "other"]
    return Decision(give_up="every offer failed: " + ("; ".join(messages[-5:]) or "none tried"))


def key_label(key: OfferKey) -> str:
    """As Offer.label: aws/us-east-1a/g5.xlarge (spot)."""
    return f"{key[0]}/{key[2] or key[1]}/{key[3]}{' (spot)' if key[4] else ''}"


def _fits(key: OfferKey, fitting: Sequence[Offer]) -> bool:
    return any(offer_key(o) == key for o in fitting)
