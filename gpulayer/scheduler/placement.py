"""Place one job: the best worker that can take it now, or every worker's reasons why not."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpulayer.scheduler.feasibility import CHECKS, Check, reasons_never, reasons_now
from gpulayer.scheduler.gpus import pick_gpus
from gpulayer.scheduler.index import WorkerIndex
from gpulayer.scheduler.outcome import Explanation, Placement, Unplaced
from gpulayer.scheduler.snapshot import WorkerSnapshot
from gpulayer.scheduler.strategies import rank_key
from gpulayer.spec.models import JobSpec

Workers = WorkerIndex | Iterable[WorkerSnapshot]


def place(job: JobSpec, workers: Workers) -> Placement | Unplaced:
    """Where the job goes now under its strategy; Unplaced carries each worker's reasons.

    With a :class:`WorkerIndex` the choice comes from the index; with plain snapshots, from
    a scan of each one (the same answer, in time proportional to the number of workers).
    """
    if isinstance(workers, WorkerIndex):
        chosen = workers.choose(job)
    else:
        workers = list(workers)
        chosen = place_by_scan(job, workers)
    if chosen is not None:
        return chosen
    explanation = explain(job, workers)
    return Unplaced(reasons=explanation.now, never=not explanation.could_ever_run)


def place_by_scan(
    job: JobSpec, workers: Iterable[WorkerSnapshot], checks: Sequence[Check] = CHECKS
) -> Placement | None:
    """Every worker judged by the whole check chain, the best ranked one chosen.

    The reference the index is measured against, and fine for a handful of workers.
    """
    fitting = [w for w in workers if not reasons_now(job, w, checks)]
    if not fitting:
        return None
    best = min(fitting, key=lambda w: rank_key(job, w))
    gpus = pick_gpus(job.resources, best)
    if gpus is None:  # reasons_now counted the same devices; a mismatch is a bug here
        raise AssertionError(f"worker {best.id}: fits but has too few fitting GPUs")
    return Placement(best.id, gpus)


def explain(job: JobSpec, workers: Workers) -> Explanation:
    """For every worker, why it cannot take the job now, and why it could never run it."""
    if isinstance(workers, WorkerIndex):
        return workers.explain(job)
    now: dict[str, list[str]] = {}
    never: dict[str, list[str]] = {}
    for worker in workers:
        now[worker.id] = reasons_now(job, worker)
        never[worker.id] = reasons_never(job, worker)
    return Explanation(now=now, never=never)
