"""Bridge from stored state to the pure scheduler: snapshots in, assignments out."""

from __future__ import annotations

from collections import defaultdict

from gpulayer.control.store import JobRecord, Store
from gpulayer.control.targets import TARGET_WORKER_KIND, WorkerView
from gpulayer.scheduler import QueuedJob, WorkerSnapshot, node_count, plan
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


def plan_assignments(store: Store) -> list[tuple[str, list[tuple[str, tuple[int, ...]]]]]:
    """(job id, its nodes: (worker id, GPU indices) by node rank) for queued jobs that fit now,
    per target pool. A job of one node has one; a gang has all of its N, never fewer."""
    queued = store.queued_jobs()
    if not queued:
        return []
    views = worker_snapshots(store, only_ready=True)
    decisions: list[tuple[str, list[tuple[str, tuple[int, ...]]]]] = []
    for target, kind in TARGET_WORKER_KIND.items():
        jobs = [j for j in queued if j.target == target]
        if target == "cloud":
            decisions += _reserved_assignments(store, jobs, views)
            continue
        workers = [v.snapshot for v in views if v.kind == kind]
        if not jobs or not workers:
            continue
        queue = [QueuedJob(j.id, spec, j.created_at) for j in jobs if (spec := _readable(j))]
        nodes: dict[str, list[tuple[int, str, tuple[int, ...]]]] = {}
        for assignment in plan(queue, workers):
            nodes.setdefault(assignment.job_id, []).append(
                (assignment.node_rank, assignment.worker_id, tuple(assignment.gpu_indices))
            )
        for job_id, placed in nodes.items():
            decisions.append((job_id, [(w, g) for _, w, g in sorted(placed)]))
    return decisions


def _reserved_assignments(
    store: Store, jobs: list[JobRecord], views: list[WorkerView]
) -> list[tuple[str, list[tuple[str, tuple[int, ...]]]]]:
    """A cloud job runs only on the workers of the instances reserved for it, once they all
    joined, node rank r on node r's instance. The machines were chosen for the job, so worker
    pins in its spec name other workers."""
    if not jobs:
        return []
    by_id = {v.snapshot.id: v.snapshot for v in views if v.kind == "cloud"}
    rank_of = {i.request_id: i.node_rank for i in store.list_instances(live_only=True)}
    bound: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for r in store.live_reservations():
        if r.state == "bound" and r.worker_id in by_id:
            bound[r.job_id].append((rank_of.get(r.request_id, 0), r.worker_id))
    decisions = []
    for job in jobs:
        spec = JobSpec.model_validate(job.spec)
        # A gang's instances' workers, by their node ranks; it goes once all N joined.
        workers = [w for _, w in sorted(bound.get(job.id, []))]
        if not workers or len(workers) != node_count(spec):
            continue
        spec.placement.worker_ids = []
        spec.placement.worker_labels = {}
        queue = [QueuedJob(job.id, spec, job.created_at)]
        placed = {
            a.worker_id: tuple(a.gpu_indices) for a in plan(queue, [by_id[w] for w in workers])
        }
        if len(placed) == len(workers):
            decisions.append((job.id, [(w, placed[w]) for w in workers]))
    return decisions
