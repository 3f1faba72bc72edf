"""Bridge from stored state to the pure scheduler: snapshots in, assignments out."""

from __future__ import annotations

from collections import defaultdict

from gpulayer.control.store import JobRecord, Store
from gpulayer.control.targets import TARGET_WORKER_KIND, WorkerView
from gpulayer.scheduler import QueuedJob, WorkerSnapshot, plan
from gpulayer.spec import JobSpec
from gpulayer.spec.capabilities import WorkerCapabilities


def worker_snapshots(store: Store, *, only_ready: bool = False) -> list[WorkerView]:
    """Every worker with its free capacity, from the attempts running on it."""
    busy_gpus: dict[str, set[int]] = defaultdict(set)
    busy_cores: dict[str, float] = defaultdict(float)
    busy_memory: dict[str, float] = defaultdict(float)
    running: dict[str, int] = defaultdict(int)
    active = [a for a in store.active_attempts() if a.worker_id is not None]
    specs = store.job_specs([a.job_id for a in active])  # one query, not one per attempt
    for attempt in active:
        assert attempt.worker_id is not None
        resources = specs.get(attempt.job_id, {}).get("resources") or {}
        busy_gpus[attempt.worker_id].update(attempt.gpu_indices)
        busy_cores[attempt.worker_id] += float(resources.get("cpu_cores") or 0)
        busy_memory[attempt.worker_id] += float(resources.get("memory_gb") or 0)
        running[attempt.worker_id] += 1
    views = []
    for worker in store.list_workers():
        if only_ready and worker.state != "ready":
            continue
        caps = WorkerCapabilities.model_validate(worker.capabilities)
        free_memory = None if caps.memory_gb is None else caps.memory_gb - busy_memory[worker.id]
        snapshot = WorkerSnapshot(
            id=worker.id,
            name=worker.name,
            labels=worker.labels,
            capabilities=caps,
            state=worker.state,
            free_gpus=tuple(g.index for g in caps.gpus if g.index not in busy_gpus[worker.id]),
            free_cpu_cores=caps.cpu_cores - busy_cores[worker.id],
            free_memory_gb=free_memory,
            running=running[worker.id],
        )
        views.append(WorkerView(worker.kind, snapshot))
    return views


def _readable(job: JobRecord) -> JobSpec | None:
    """The job's spec, or None for a row whose stored spec no longer validates: that one job
    waits (its status says why) rather than every job behind it."""
    try:
        return JobSpec.model_validate(job.spec)
    except ValueError:
        return None


def plan_assignments(store: Store) -> list[tuple[str, str, tuple[int, ...]]]:
    """(job id, worker id, GPU indices) for queued jobs that fit now, per target pool."""
    queued = store.queued_jobs()
    if not queued:
        return []
    views = worker_snapshots(store, only_ready=True)
    decisions: list[tuple[str, str, tuple[int, ...]]] = []
    for target, kind in TARGET_WORKER_KIND.items():
        jobs = [j for j in queued if j.target == target]
        if target == "cloud":
            # A cloud job runs only on the machine rented for it, once that machine's worker joined.
            jobs = [j for j in jobs if (j.spec.get("placement") or {}).get("worker_ids")]
        workers = [v.snapshot for v in views if v.kind == kind]
        if not jobs or not workers:
            continue
        queue = [QueuedJob(j.id, spec, j.created_at) for j in jobs if (spec := _readable(j))]
        for assignment in plan(queue, workers):
            decisions.append(
                (assignment.job_id, assignment.worker_id, tuple(assignment.gpu_indices))
            )
    return decisions
