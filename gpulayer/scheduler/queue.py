"""Plan one scheduling pass over the queue: which queued jobs start where, now.

Order: first in, first out by ``enqueued_at`` (then job id). Each job in turn goes to the
best worker that can take it now, and that worker's free GPUs, cores and memory shrink at
once, so no GPU is given twice and no worker's cores are over-committed within a pass. A job
that does not fit is skipped and later jobs that fit still start (backfill).

Anti-starvation rule. Backfill alone can starve a large job: small jobs keep taking whatever
frees up, and no single worker ever frees enough for it. So in each pass, the oldest queued
job that

- does not fit now,
- has waited at least ``starvation_seconds`` (default 300 s), and
- could run on some ready worker it is allowed on,

gets a reservation on the ready worker closest to fitting it (smallest shortfall in fitting
GPUs, then cores, then memory; then fewest running jobs; then lowest id). For the rest of
the pass no later job is placed on that worker: later jobs backfill only on other workers.
Older jobs keep their turn, since they come first in the queue.

Gangs (a distributed job of N nodes) are placed whole: N distinct workers that each fit a
node now, all taken in one step, or none (see :mod:`gpulayer.scheduler.gang`). A starving
gang's reservation covers the N ready workers closest to fitting a node each, so no later
job backfills onto any of them.

Why the reserved job runs eventually: only older jobs can take capacity on the reserved
worker, and there are finitely many of them; after that the reserved worker only gains free
capacity as its jobs end. A later pass may move the reservation, but only to a worker that is
at least as close, so the shortfall never grows and reaches zero once enough jobs end. One job
holds a reservation at a time; the next starving job gets its turn after that one starts.

The pass is pure: no clock is read unless ``now`` is left out, and nothing is stored.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

from gpulayer.scheduler.gang import choose_gang, closest_gang, node_count
from gpulayer.scheduler.index import WorkerIndex
from gpulayer.scheduler.snapshot import WorkerSnapshot
from gpulayer.spec.models import JobSpec

DEFAULT_STARVATION_SECONDS = 300.0
_FIFO = operator.attrgetter("enqueued_at", "job_id")


@dataclass(frozen=True)
class QueuedJob:
    job_id: str
    spec: JobSpec
    enqueued_at: float
    """Seconds since the epoch (or any clock ``now`` is read from)."""


@dataclass(frozen=True)
class Assignment:
    job_id: str
    worker_id: str
    gpu_indices: tuple[int, ...] = ()
    node_rank: int = 0
    """A gang's node on this worker; 0 for a job of one node."""


@dataclass(frozen=True)
class Reservation:
    job_id: str
    worker_id: str
    gang_worker_ids: tuple[str, ...] = ()
    """Every worker a gang's reservation holds (worker_id first); empty for one node."""

    @property
    def worker_ids(self) -> tuple[str, ...]:
        return self.gang_worker_ids or (self.worker_id,)


@dataclass(frozen=True)
class PlanResult:
    assignments: list[Assignment] = field(default_factory=list)
    reservation: Reservation | None = None
    decisions: int = 0
    """Queued jobs the pass was given (given first in, first out: those it took before it
    stopped)."""


def plan(
    queue: Iterable[QueuedJob],
    workers: WorkerIndex | Iterable[WorkerSnapshot],
    *,
    now: float | None = None,
    starvation_seconds: float = DEFAULT_STARVATION_SECONDS,
) -> list[Assignment]:
    """The jobs that start now and where; see the module docstring for the rules."""
    return plan_pass(queue, workers, now=now, starvation_seconds=starvation_seconds).assignments


def _ordered(
    queue: Iterable[QueuedJob], in_given_order: bool, first_in_first_out: bool
) -> Iterable[QueuedJob]:
    """The queue in the order the pass takes it.

    A pass stops before a job once no worker has a core left, so that no job from there on
    fits (each asks for some), and none can take the reservation either: one is held, or
    (first in, first out) every later job waited less than this one. A queue given first in,
    first out is taken as it comes, lazily, so a pass that gives out the room one ending job
    freed stops there and never makes the rest of a long queue."""
    if first_in_first_out:
        return queue
    return list(queue) if in_given_order else sorted(queue, key=_FIFO)


def plan_pass(
    queue: Iterable[QueuedJob],
    workers: WorkerIndex | Iterable[WorkerSnapshot],
    *,
    now: float | None = None,
    starvation_seconds: float = DEFAULT_STARVATION_SECONDS,
    in_given_order: bool = False,
    first_in_first_out: bool = False,
) -> PlanResult:
    """Like :func:`plan`, also saying which job holds the reservation, if any.

    ``in_given_order`` takes the queue as ordered already (by priority and fair share, see
    :mod:`gpulayer.admission`) instead of first in, first out. ``first_in_first_out`` says
    the queue comes first in, first out already: it is taken as it comes, lazily, so a pass
    that stops early (no core left anywhere) never makes the rest of a long queue.

    A :class:`WorkerIndex` passed in is updated with the assignments (their GPUs, cores and
    memory are taken), as the control plane will record them; plain snapshots are copied.
    """
    index = workers if isinstance(workers, WorkerIndex) else WorkerIndex(workers)
    clock = time.time() if now is None else now
    ordered = _ordered(queue, in_given_order, first_in_first_out)
    fifo = not in_given_order
    taken = 0
    # Within a pass free capacity only shrinks and the reserved worker only leaves the pool,
    # so a request that found no room finds none later in the pass either.
    memo = not index.has_extra_checks
    no_room: set[Hashable] = set()
    reserved: set[str] = set()
    reservation: Reservation | None = None
    assignments: list[Assignment] = []
    for item in ordered:
        if not index.with_free_cores and (
            reservation is not None or (fifo and clock - item.enqueued_at < starvation_seconds)
        ):
            break  # see _ordered
        taken += 1
        spec = item.spec
        key = index.pass_key(spec) if memo else None
        if key is None or key not in no_room:
            nodes = node_count(spec)
            if nodes > 1:
                gang = choose_gang(spec, index, exclude=reserved)
                if gang is not None:
                    for rank, node in enumerate(gang):
                        index.assign(spec, node)
                        assignments.append(
                            Assignment(item.job_id, node.worker_id, node.gpu_indices, rank)
                        )
                    continue
            else:
                placement = index.choose(spec, exclude=reserved)
                if placement is not None:
                    index.assign(spec, placement)
                    assignments.append(
                        Assignment(item.job_id, placement.worker_id, placement.gpu_indices)
                    )
                    continue
            if key is not None:
                no_room.add(key)
        if reservation is None and clock - item.enqueued_at >= starvation_seconds:
            nodes = node_count(spec)
            if nodes > 1:
                held = closest_gang(spec, index, exclude=reserved)
                if held is not None:
                    reservation = Reservation(item.job_id, held[0], tuple(held))
                    reserved.update(held)
            else:
                worker_id = index.closest(spec, exclude=reserved)
                if worker_id is not None:
                    reservation = Reservation(item.job_id, worker_id)
                    reserved.add(worker_id)
    given = len(ordered) if isinstance(ordered, list) and not first_in_first_out else taken
    return PlanResult(assignments=assignments, reservation=reservation, decisions=given)
