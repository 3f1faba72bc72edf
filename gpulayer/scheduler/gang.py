"""Gangs: a distributed job with ``num_workers: N`` runs one node per worker on N distinct
workers, all placed together or not at all.

A gang never holds part of its slots: either every node finds a worker now and all N are
taken in one step, or nothing is taken and the job waits (or holds the anti-starvation
reservation on the N workers closest to fitting it, see :mod:`gpulayer.scheduler.queue`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TypeVar

from gpulayer.scheduler.feasibility import reasons_never
from gpulayer.scheduler.index import WorkerIndex, node_count
from gpulayer.scheduler.outcome import Placement
from gpulayer.scheduler.snapshot import WorkerSnapshot
from gpulayer.spec.models import JobSpec


def choose_gang(
    job: JobSpec, index: WorkerIndex, *, exclude: Collection[str] = frozenset()
) -> list[Placement] | None:
    """N placements on N distinct workers, best ranked first (node rank 0), or None.

    Nothing in ``index`` changes; the caller assigns all N or none."""
    picked = _distinct(job, lambda taken: index.choose(job, exclude=taken), exclude)
    return picked if len(picked) == node_count(job) else None


def fitting_now(job: JobSpec, index: WorkerIndex) -> int:
    """How many distinct workers could take one node of the job now (at most N)."""
    return len(_distinct(job, lambda taken: index.choose(job, exclude=taken), ()))


def closest_gang(
    job: JobSpec, index: WorkerIndex, *, exclude: Collection[str] = frozenset()
) -> list[str] | None:
    """The N ready workers nearest to fitting one node each, or None when fewer exist."""
    held = _distinct(job, lambda taken: index.closest(job, exclude=taken), exclude)
    return held if len(held) == node_count(job) else None


T = TypeVar("T", Placement, str)


def _distinct(
    job: JobSpec, pick: Callable[[set[str]], T | None], exclude: Collection[str]
) -> list[T]:
    """Up to N picks, each on a worker none of the earlier ones (or ``exclude``) holds."""
    picked: list[T] = []
    taken = set(exclude)
    for _ in range(node_count(job)):
        found = pick(taken)
        if found is None:
            break
        picked.append(found)
        taken.add(found if isinstance(found, str) else found.worker_id)
    return picked


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
