"""Gangs: a distributed job with ``num_workers: N`` runs one node per worker on N distinct
workers, all placed together or not at all.

A gang never holds part of its slots: either every node finds a worker now and all N are
taken in one step, or nothing is taken and the job waits (or holds the anti-starvation
reservation on the N workers closest to fitting it, see :mod:`gpulayer.scheduler.queue`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from gpulayer.scheduler.feasibility import reasons_never
from gpulayer.scheduler.index import WorkerIndex
from gpulayer.scheduler.outcome import Placement
from gpulayer.scheduler.snapshot import WorkerSnapshot
from gpulayer.spec.models import DistributedWorkload, JobSpec


def node_count(job: JobSpec) -> int:
    """How many workers the job needs at once: num_workers for a distributed job, else 1."""
    workload = job.workload
    return workload.num_workers if isinstance(workload, DistributedWorkload) else 1


def choose_gang(
    job: JobSpec, index: WorkerIndex, *, exclude: Collection[str] = frozenset()
) -> list[Placement] | None:
    """N placements on N distinct workers, best ranked first (node rank 0), or None.

    Nothing in ``index`` changes; the caller assigns all N or none."""
    picked: list[Placement] = []
    taken = set(exclude)
    for _ in range(node_count(job)):
        placement = index.choose(job, exclude=taken)
        if placement is None:
            return None
        picked.append(placement)
        taken.add(placement.worker_id)
    return picked


def fitting_now(job: JobSpec, index: WorkerIndex) -> int:
    """How many distinct workers could take one node of the job now (at most N)."""
    taken: set[str] = set()
    for _ in range(node_count(job)):
        placement = index.choose(job, exclude=taken)
        if placement is None:
            break
        taken.add(placement.worker_id)
    return len(taken)


def closest_gang(
    job: JobSpec, index: WorkerIndex, *, exclude: Collection[str] = frozenset()
) -> list[str] | None:
    """The N ready workers nearest to fitting one node each, or None when fewer exist."""
    chosen: list[str] = []
    taken = set(exclude)
    for _ in range(node_count(job)):
        worker_id = index.closest(job, exclude=taken)
        if worker_id is None:
            return None
        chosen.append(worker_id)
        taken.add(worker_id)
    return chosen


def never_reasons(
    job: JobSpec, workers: Iterable[WorkerSnapshot], *, label: Mapping[str, str] | None = None
) -> list[str] | None:
    """None when at least N workers could ever run a node of the job; else why not, per
    worker that could not, and how many could."""
    needed = node_count(job)
    able = 0
    reasons: list[str] = []
    seen = 0
    for worker in workers:
        seen += 1
        found = reasons_never(job, worker)
        if not found:
            able += 1
            continue
        name = (label or {}).get(worker.id, f"worker {worker.name}")
        reasons.extend(f"{name}: {reason}" for reason in found)
    if able >= needed:
        return None
    if needed > 1 and seen:
        reasons.insert(
            0, f"num_workers: {needed} nodes need {needed} distinct workers; {able} could run one"
        )
    return reasons
