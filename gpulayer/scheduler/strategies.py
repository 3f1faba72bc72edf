"""Ranking strategies: among workers that fit, which one a job goes to.

Each strategy maps a worker to a sort key; the smallest key wins. Every key ends with the
worker id, so ties break the same way on every run.

- ``spread``: least-loaded first. Fewest running jobs, then the most free units of what the
  job consumes (GPUs then cores for a GPU job; cores for a CPU job, so a CPU job does not
  prefer a worker merely for its idle GPUs), then id.
- ``first_fit``: the lowest worker id with room, which packs work onto few workers.
- ``most_free_memory``: the most free GPU memory (summed over free devices) for a GPU job,
  the most free host memory otherwise.

A key depends on the job only through which of these orderings applies (see
:func:`ordering_for`), so an index can keep workers sorted once per ordering.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from gpulayer.scheduler.errors import UnknownStrategy
from gpulayer.scheduler.gpus import free_gpu_memory
from gpulayer.scheduler.snapshot import WorkerSnapshot
from gpulayer.spec.models import JobSpec

RankKey = tuple[Any, ...]
Ordering = Callable[[WorkerSnapshot], RankKey]


def spread_gpu(worker: WorkerSnapshot) -> RankKey:
    return (worker.running, -len(worker.free_gpus), -worker.free_cpu_cores, worker.id)


def spread_cpu(worker: WorkerSnapshot) -> RankKey:
    return (worker.running, -worker.free_cpu_cores, worker.id)


def lowest_id(worker: WorkerSnapshot) -> RankKey:
    return (worker.id,)


def most_free_gpu_memory(worker: WorkerSnapshot) -> RankKey:
    return (-free_gpu_memory(worker), worker.id)


def most_free_host_memory(worker: WorkerSnapshot) -> RankKey:
    free = worker.host_memory_free
    # A worker that reports no memory ranks after every worker that does.
    return (float("inf") if free is None else -free, worker.id)


ORDERINGS: Mapping[str, Ordering] = MappingProxyType(
    {
        "spread_gpu": spread_gpu,
        "spread_cpu": spread_cpu,
        "first_fit": lowest_id,
        "most_free_gpu_memory": most_free_gpu_memory,
        "most_free_host_memory": most_free_host_memory,
    }
)

STRATEGIES: tuple[str, ...] = ("spread", "first_fit", "most_free_memory")


def ordering_for(job: JobSpec, strategy: str | None = None) -> str:
    """The name in :data:`ORDERINGS` that ranks workers for this job."""
    chosen = strategy or job.placement.strategy
    gpu_job = job.resources.gpus > 0
    if chosen == "spread":
        return "spread_gpu" if gpu_job else "spread_cpu"
    if chosen == "first_fit":
        return "first_fit"
    if chosen == "most_free_memory":
        return "most_free_gpu_memory" if gpu_job else "most_free_host_memory"
    raise UnknownStrategy(f"strategy: unknown {chosen!r}; known: {', '.join(STRATEGIES)}")


def rank_key(job: JobSpec, worker: WorkerSnapshot, strategy: str | None = None) -> RankKey:
    return ORDERINGS[ordering_for(job, strategy)](worker)


def rank(
    job: JobSpec, workers: Iterable[WorkerSnapshot], strategy: str | None = None
) -> list[WorkerSnapshot]:
    """Workers best first for this job under its strategy (or ``strategy``)."""
    ordering = ORDERINGS[ordering_for(job, strategy)]
    return sorted(workers, key=ordering)
