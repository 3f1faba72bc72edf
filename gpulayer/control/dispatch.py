"""Bridge from stored state to the pure scheduler: snapshots in, assignments out.

The control plane keeps its ready workers in a :class:`LivePlacement` between dispatch
passes, so a pass reads only the workers something happened to since the last one (the
service notes them as workers register, heartbeat, go lost or gone, and attempts start and
end), not every worker and every running attempt. Three things keep that cache from placing
a job where it cannot run:

- every worker a pass chose is read again, with its running attempts, just before the
  assignments are handed back (unless the same pass read it already, before planning), and
  each assignment is judged by the feasibility checks on that fresh snapshot (with the
  pass's earlier assignments taken from it); one that no longer fits is dropped and its job
  waits for the next pass;
- every worker a pass chose is read again on the next pass, whatever became of its
  assignments;
- the whole cache is rebuilt from the store on the first pass (so after a restart) and
  every ``full_every`` seconds after, which also picks up what another control plane sharing
  the store changed.

It keeps the queue too: the queued jobs' ids, targets and times, read whole on the first pass
and every ``queue_full_every`` seconds (1 by default: a job another control plane queued waits
no longer than that), and in between brought up to date from what this control plane noted
(jobs stored queued, jobs that left the queue, a job put back in it), so a pass over a long
queue reads nothing of it. A job noted as queued that is no longer (taken by another control
plane) is only a placement the store then refuses: assigning is conditional.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpulayer.control.arrays import ARRAY_LABEL, LIMIT_LABEL, held_back
from gpulayer.control.store import AttemptRecord, JobRecord, QueuedHead, Store, WorkerRecord
from gpulayer.control.targets import TARGET_WORKER_KIND, WorkerView
from gpulayer.scheduler import (
    QueuedJob,
    WorkerIndex,
    WorkerSnapshot,
    node_count,
    plan,
    plan_pass,
    reasons_now,
)
from gpulayer.scheduler.gpus import device_meets
from gpulayer.spec import JobSpec
from gpulayer.spec.capabilities import WorkerCapabilities

Nodes = list[tuple[str, tuple[int, ...]]]
"""(worker id, GPU indices) by node rank."""

_KINDS = tuple(dict.fromkeys(TARGET_WORKER_KIND.values()))

_KEPT_PAST_QUEUE = 256
"""Specs of jobs that left the queue kept at most (beyond twice the queue) before they go."""

_Parsed = dict[str, tuple[dict[str, Any], WorkerCapabilities]]
"""Per worker id, its stored capabilities and their validated form, so that an unchanged
worker read again is not validated again."""


def _capabilities(worker: WorkerRecord, parsed: _Parsed | None) -> WorkerCapabilities:
    if parsed is not None:
        known = parsed.get(worker.id)
        if known is not None and known[0] == worker.capabilities:
            return known[1]
    caps = WorkerCapabilities.model_validate(worker.capabilities)
    if parsed is not None:
        parsed[worker.id] = (worker.capabilities, caps)
    return caps


def _placement_state(worker: WorkerRecord) -> str:
    """A ready worker that said it takes no job (its disk is full) is placed nothing: its
    state reads ``degraded: <why>`` to the checks, which then say so of every job."""
    degraded = worker.capabilities.get("degraded")
    if worker.state == "ready" and degraded:
        return f"degraded: {degraded}"
    return worker.state


def _views(
    workers: Iterable[WorkerRecord],
    attempts: Iterable[AttemptRecord],
    specs: Mapping[str, dict[str, Any]],
    parsed: _Parsed | None = None,
) -> list[WorkerView]:
    """Each worker with its free capacity, from the attempts running on it."""
    busy_gpus: dict[str, set[int]] = defaultdict(set)
    busy_cores: dict[str, float] = defaultdict(float)
    busy_memory: dict[str, float] = defaultdict(float)
    running: dict[str, int] = defaultdict(int)
    for attempt in attempts:
        if attempt.worker_id is None:
            continue
        resources = specs.get(attempt.job_id, {}).get("resources") or {}
        busy_gpus[attempt.worker_id].update(attempt.gpu_indices)
        busy_cores[attempt.worker_id] += float(resources.get("cpu_cores") or 0)
        busy_memory[attempt.worker_id] += float(resources.get("memory_gb") or 0)
        running[attempt.worker_id] += 1
    views = []
    for worker in workers:
        caps = _capabilities(worker, parsed)
        free_memory = None if caps.memory_gb is None else caps.memory_gb - busy_memory[worker.id]
        snapshot = WorkerSnapshot(
            id=worker.id,
            name=worker.name,
            labels=worker.labels,
            capabilities=caps,
            state=_placement_state(worker),
            free_gpus=tuple(g.index for g in caps.gpus if g.index not in busy_gpus[worker.id]),
            free_cpu_cores=caps.cpu_cores - busy_cores[worker.id],
            free_memory_gb=free_memory,
            running=running[worker.id],
        )
        views.append(WorkerView(worker.kind, snapshot))
    return views


def worker_snapshots(store: Store, *, only_ready: bool = False) -> list[WorkerView]:
    """Every worker with its free capacity, from the attempts running on it."""
    active = [a for a in store.active_attempts() if a.worker_id is not None]
    specs = store.job_specs([a.job_id for a in active])  # one query, not one per attempt
    workers = [w for w in store.list_workers() if not only_ready or w.state == "ready"]
    return _views(workers, active, specs)


def _read_views(
    store: Store,
    worker_ids: Iterable[str],
    parsed: _Parsed,
    used: dict[str, dict[str, Any]] | None = None,
) -> tuple[dict[str, WorkerView], dict[str, set[str]]]:
    """These workers as they are stored now, and the jobs each runs: three queries, whatever
    their number. ``used`` keeps, per job, the part of its spec that takes capacity: a
    stored spec never changes, so only jobs not in it yet are read."""
    ids = list(worker_ids)
    attempts = store.active_attempts_on(ids)
    if used is None:
        specs = store.job_specs([a.job_id for a in attempts])
    else:
        missing = [a.job_id for a in attempts if a.job_id not in used]
        for job_id, spec in store.job_specs(missing).items() if missing else ():
            used[job_id] = {"resources": spec.get("resources") or {}}
        specs = used
    views = _views(store.workers_by_ids(ids), attempts, specs, parsed)
    return {view.snapshot.id: view for view in views}, _runs(attempts)


def _runs(attempts: Iterable[AttemptRecord]) -> dict[str, set[str]]:
    runs: dict[str, set[str]] = defaultdict(set)
    for attempt in attempts:
        if attempt.worker_id is not None:
            runs[attempt.worker_id].add(attempt.job_id)
    return runs


@dataclass(frozen=True)
class Planned:
    job_id: str
    spec: JobSpec
    """The spec as placed (a cloud job's without its worker pins)."""
    kind: str
    nodes: Nodes


def _still_fits(spec: JobSpec, snapshot: WorkerSnapshot, gpus: Sequence[int]) -> bool:
    """Whether the worker, as stored now, can take the job on exactly these GPUs."""
    r = spec.resources
    chosen = set(gpus)
    if reasons_now(spec, snapshot) or len(chosen) != r.gpus:
        return False
    if not chosen <= set(snapshot.free_gpus):
        return False
    devices = [d for d in snapshot.capabilities.gpus if d.index in chosen]
    return all(device_meets(r, device) for device in devices)


class LivePlacement:
    """The ready workers of each kind, kept in a :class:`WorkerIndex` between dispatch passes
    and brought up to date from what the control plane noted as changed.

    The notes may come from any thread; :meth:`pools` and :meth:`confirm` are called by one
    dispatch pass at a time.
    """

    def __init__(
        self,
        store: Store,
        *,
        full_every: float = 60.0,
        queue_full_every: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.full_every = full_every
        """Seconds between full rebuilds from the store; 0 rebuilds on every pass."""
        self.queue_full_every = queue_full_every
        """Seconds between reads of the whole queue; 0 reads it on every pass."""
        self._queue: dict[str, QueuedHead] = {}
        self._queue_read_at: float | None = None
        """When the queue was last read whole; None: read it on the next pass."""
        self._queue_news: list[tuple[str, QueuedHead | None]] = []
        """Noted since the last pass, in order: a job queued (its head) or gone (None)."""
        self._known_specs: dict[str, tuple[JobSpec, Mapping[str, str]]] = {}
        """Noted since the last pass: jobs stored queued with the spec their submit validated
        (and the labels stored with it), so the pass need not read and validate them again."""
        self._items: dict[str, QueuedJob] = {}
        """Queued jobs as the scheduler takes them, made once per job."""
        self._clock = clock
        self._lock = threading.Lock()
        self._dirty: set[str] = set()
        self._stale = True
        self._built_at = 0.0
        self._pools: dict[str, WorkerIndex] = {kind: WorkerIndex() for kind in _KINDS}
        self._kind_of: dict[str, str] = {}
        """The pool each indexed worker is in."""
        self._jobs_on: dict[str, set[str]] = defaultdict(set)
        """Per job, the workers its active attempts ran on when last read."""
        self._runs: dict[str, set[str]] = {}
        self._read_this_pass: dict[str, WorkerView | None] = {}
        """The workers this pass read from the store before planning, as read (None: its
        row is gone): the final check takes them as they are rather than reading again."""
        self._parsed: _Parsed = {}
        self._used: dict[str, dict[str, Any]] = {}
        """Per job with an active attempt when last read, the resources its spec takes."""
        self._specs: dict[str, JobSpec | None] = {}
        """Queued jobs' validated specs (a stored spec never changes): validated once, not
        on every pass."""
        self._labels: dict[str, Mapping[str, str]] = {}
        """The labels of the queued jobs among them whose array has a parallelism limit."""
        self.rebuilds = 0
        self.refreshed = 0
        """Workers read again one by one (not by a rebuild), for the benchmark and tests."""
        self.rejected = 0
        """Assignments the final check against the store dropped."""

    # --- what the control plane notes -------------------------------------------------------

    def worker_changed(self, *worker_ids: str | None) -> None:
        """Something about these workers changed (state, capabilities, labels, attempts)."""
        with self._lock:
            self._dirty.update(w for w in worker_ids if w)

    def job_changed(self, job_id: str) -> None:
        """The job's attempts started or ended: read the workers they ran on again."""
        with self._lock:
            self._dirty.update(self._jobs_on.get(job_id, ()))

    def worker_alive(self, worker_id: str) -> None:
        """A heartbeat: news only for a worker that was not ready when last read."""
        with self._lock:
            if worker_id not in self._kind_of:
                self._dirty.add(worker_id)

    def invalidate(self) -> None:
        """Rebuild everything from the store on the next pass."""
        with self._lock:
            self._stale = True
            self._queue_read_at = None

    def jobs_queued(
        self,
        heads: Iterable[QueuedHead],
        specs: Mapping[str, tuple[JobSpec, Mapping[str, str]]] | None = None,
    ) -> None:
        """These jobs were stored queued; ``specs``: per job, the validated spec its stored one
        is the dump of, and its stored labels (a job left out is read when first placed)."""
        with self._lock:
            self._queue_news.extend((head.id, head) for head in heads)
            if specs:
                self._known_specs.update(specs)

    def jobs_left_queue(self, job_ids: Iterable[str]) -> None:
        """These jobs are no longer queued (placed, cancelled, failed, gone)."""
        with self._lock:
            self._queue_news.extend((job_id, None) for job_id in job_ids)

    def queue_changed(self) -> None:
        """The queue changed in a way not noted job by job (a job put back in it): read it
        whole on the next pass."""
        with self._lock:
            self._queue_read_at = None

    # --- what a dispatch pass asks ----------------------------------------------------------

    def pools(self) -> Mapping[str, WorkerIndex]:
        """Per worker kind, the index of its ready workers, brought up to date."""
        with self._lock:
            full = self._stale or self._clock() - self._built_at >= self.full_every
            dirty, self._dirty = self._dirty, set()
            self._stale = False
        self._read_this_pass = {}
        try:
            if full:
                self._rebuild()
            elif dirty:
                self._refresh(dirty)
        except BaseException:
            self.invalidate()  # half-updated: start from the store next time
            raise
        return self._pools

    def confirm(self, planned: Sequence[Planned]) -> list[Planned]:
        """The planned assignments that still fit the chosen workers as stored now.

        Each is judged in order on a fresh read of its workers, less what the earlier ones
        took; every chosen worker is read again on the next pass."""
        ids = {worker_id for p in planned for worker_id, _ in p.nodes}
        if not ids:
            return []
        read, self._read_this_pass = self._read_this_pass, {}  # this pass's reads only
        fresh = {w: view for w in ids & read.keys() if (view := read[w]) is not None}
        unread = ids - read.keys()
        if unread:
            fresh.update(_read_views(self.store, unread, self._parsed, self._used)[0])
        self.worker_changed(*ids)
        now = {worker_id: view.snapshot for worker_id, view in fresh.items()}
        kept = []
        for p in planned:
            taken: dict[str, WorkerSnapshot] = {}
            for worker_id, gpus in p.nodes:
                view = fresh.get(worker_id)
                snapshot = now.get(worker_id)
                if view is None or snapshot is None or view.kind != p.kind:
                    break
                if not _still_fits(p.spec, snapshot, gpus):
                    break
                r = p.spec.resources
                taken[worker_id] = snapshot.take(gpus, r.cpu_cores, r.memory_gb)
            else:
                now.update(taken)
                kept.append(p)
                # What the job will take, known here: the next pass reads its workers' new
                # attempts without reading this job's spec back (whether or not the store
                # then takes the assignment: a job not running on a worker is not counted).
                r = p.spec.resources
                self._used.setdefault(
                    p.job_id, {"resources": {"cpu_cores": r.cpu_cores, "memory_gb": r.memory_gb}}
                )
                continue
            self.rejected += 1
        return kept

    def queued(self) -> list[QueuedHead]:
        """The queued jobs, FIFO: read whole when due, else as noted since the last pass."""
        with self._lock:
            now = self._clock()
            whole = (
                self._queue_read_at is None or now - self._queue_read_at >= self.queue_full_every
            )
            news, self._queue_news = self._queue_news, []
            known, self._known_specs = self._known_specs, {}
            if whole:
                self._queue_read_at = now
        for job_id, (spec, labels) in known.items():
            self._specs.setdefault(job_id, spec)  # dropped by specs_of once no longer queued
            if LIMIT_LABEL in labels:
                self._labels[job_id] = labels
        try:
            if whole:
                # Read after the news was taken: whatever was noted before is in the read.
                self._queue = {head.id: head for head in self.store.queued_job_heads()}
                return list(self._queue.values())
        except BaseException:
            self.queue_changed()
            raise
        for job_id, head in news:
            if head is None:
                self._queue.pop(job_id, None)
            else:
                self._queue[job_id] = head
        heads = list(self._queue.values())
        added = any(head is not None for _, head in news)  # removals keep the order
        if added and any(
            (a.created_at, a.id) > (b.created_at, b.id) for a, b in itertools.pairwise(heads)
        ):
            heads.sort(key=lambda head: (head.created_at, head.id))  # a job put back in line
            self._queue = {head.id: head for head in heads}
        return heads

    def item_of(self, job_id: str, spec: JobSpec, created_at: float) -> QueuedJob:
        """The queued job as the scheduler takes it, made once while it stays queued."""
        item = self._items.get(job_id)
        if item is None or item.spec is not spec:
            item = self._items[job_id] = QueuedJob(job_id, spec, created_at)
        return item

    def specs_of(self, heads: Sequence[QueuedHead]) -> Mapping[str, JobSpec | None]:
        """The queued jobs' validated specs (a job whose row is gone: none), kept while they
        stay queued: only jobs new to the queue are read in full and validated. What is kept
        of jobs that left the queue goes now and then, not on every pass (which would cost a
        pass over the whole queue each time)."""
        known = self._specs
        missing = [h.id for h in heads if h.id not in known]
        for job in self.store.get_jobs(missing) if missing else []:
            known[job.id] = _readable(job)
            if LIMIT_LABEL in job.labels:
                self._labels[job.id] = job.labels
        if len(known) > 2 * len(heads) + _KEPT_PAST_QUEUE or len(self._items) > len(known):
            queued = {h.id for h in heads}
            self._specs = known = {j: s for j, s in known.items() if j in queued}
            self._labels = {j: self._labels[j] for j in queued if j in self._labels}
            self._items = {j: item for j, item in self._items.items() if j in queued}
        return known

    def limited_labels(self) -> Mapping[str, Mapping[str, str]]:
        """Per queued job of an array with a parallelism limit, its labels, as read with its
        spec (most queues hold none, and a pass then skips the limits)."""
        return self._labels

    # --- internals --------------------------------------------------------------------------

    def _rebuild(self) -> None:
        self._built_at = self._clock()
        attempts = [a for a in self.store.active_attempts() if a.worker_id is not None]
        specs = self.store.job_specs([a.job_id for a in attempts])
        # Ended jobs drop out here: the kept resources are those of jobs running now.
        self._used = {j: {"resources": s.get("resources") or {}} for j, s in specs.items()}
        workers = self.store.list_workers()
        known = {w.id for w in workers}
        self._parsed = {k: v for k, v in self._parsed.items() if k in known}
        views = _views(workers, attempts, specs, self._parsed)
        self._read_this_pass = {view.snapshot.id: view for view in views}
        pools: dict[str, list[WorkerSnapshot]] = {kind: [] for kind in _KINDS}
        kind_of: dict[str, str] = {}
        for view in views:
            if view.snapshot.ready and view.kind in pools:
                pools[view.kind].append(view.snapshot)
                kind_of[view.snapshot.id] = view.kind
        self._pools = {kind: WorkerIndex(snapshots) for kind, snapshots in pools.items()}
        self._kind_of = kind_of
        with self._lock:
            self._runs = {}
            self._jobs_on = defaultdict(set)
            for worker_id, jobs in _runs(attempts).items():
                self._set_runs(worker_id, jobs)
        self.rebuilds += 1

    def _refresh(self, worker_ids: set[str]) -> None:
        fresh, runs = _read_views(self.store, worker_ids, self._parsed, self._used)
        self._read_this_pass = {worker_id: fresh.get(worker_id) for worker_id in worker_ids}
        with self._lock:
            for worker_id in worker_ids:
                self._set_runs(worker_id, runs.get(worker_id, set()))
        for worker_id in worker_ids:
            view = fresh.get(worker_id)
            kind = None
            if view is not None and view.snapshot.ready and view.kind in self._pools:
                kind = view.kind
            old = self._kind_of.get(worker_id)
            if old is not None and old != kind:
                self._pools[old].discard(worker_id)
                del self._kind_of[worker_id]
            if view is not None and kind is not None:
                self._pools[kind].put(view.snapshot)
                self._kind_of[worker_id] = kind
            if view is None:
                self._parsed.pop(worker_id, None)  # the worker's row is gone
        self.refreshed += len(worker_ids)

    def _set_runs(self, worker_id: str, jobs: set[str]) -> None:
        """Called with the lock held."""
        for job_id in self._runs.pop(worker_id, set()):
            holders = self._jobs_on.get(job_id)
            if holders is not None:
                holders.discard(worker_id)
                if not holders:
                    del self._jobs_on[job_id]
        if jobs:
            self._runs[worker_id] = jobs
            for job_id in jobs:
                self._jobs_on[job_id].add(worker_id)


def _readable(job: JobRecord) -> JobSpec | None:
    """The job's spec, or None for a row whose stored spec no longer validates: that one job
    waits (its status says why) rather than every job behind it."""
    try:
        return JobSpec.model_validate(job.spec)
    except ValueError:
        return None


def plan_assignments(store: Store, live: LivePlacement | None = None) -> list[tuple[str, Nodes]]:
    """(job id, its nodes: (worker id, GPU indices) by node rank) for queued jobs that fit now,
    per target pool. A job of one node has one; a gang has all of its N, never fewer.

    With ``live``, the workers come from its cache and every assignment is checked against
    the store once more; without, every worker and running attempt is read for this pass."""
    queued: Sequence[QueuedHead] | Sequence[JobRecord]
    labels: Mapping[str, Mapping[str, str]]
    if live is not None:
        queued = live.queued()
        validated = live.specs_of(queued)
        labels = live.limited_labels()
    else:
        records = store.queued_jobs()
        queued = records
        validated = {j.id: _readable(j) for j in records}
        labels = {j.id: j.labels for j in records if LIMIT_LABEL in j.labels}
    if not queued:
        return []
    # Job arrays with a parallelism limit: only as many of them as the limit leaves room for.
    held = (
        held_back(
            ((j.id, labels[j.id]) for j in queued if j.id in labels),
            lambda array_id: len(
                store.jobs_with_label(ARRAY_LABEL, array_id, states=["provisioning", "running"])
            ),
        )
        if labels
        else set()
    )
    pools = live.pools() if live is not None else _pools_from(store)
    planned: list[Planned] = []
    for target, kind in TARGET_WORKER_KIND.items():
        if target == "cloud":
            cloud_ids = [j.id for j in queued if j.target == target and j.id not in held]
            if cloud_ids:
                cloud_jobs = store.get_jobs(cloud_ids)
                planned += _reserved_assignments(store, cloud_jobs, pools[kind], kind)
            continue
        index = pools[kind]
        if not len(index):
            continue
        # Taken lazily, in the queue's order (first in, first out, as the pass places): a
        # pass that gives out the room one ending job freed stops there, however long the
        # queue behind it.
        jobs = (j for j in queued if j.target == target and j.id not in held)
        queue: Iterator[QueuedJob]
        if live is not None:
            queue = (
                live.item_of(j.id, s, j.created_at) for j in jobs if (s := validated.get(j.id))
            )
        else:
            queue = (QueuedJob(j.id, s, j.created_at) for j in jobs if (s := validated.get(j.id)))
        nodes: dict[str, list[tuple[int, str, tuple[int, ...]]]] = {}
        for assignment in plan_pass(queue, index, first_in_first_out=True).assignments:
            nodes.setdefault(assignment.job_id, []).append(
                (assignment.node_rank, assignment.worker_id, tuple(assignment.gpu_indices))
            )
        for job_id, placed in nodes.items():
            spec = validated.get(job_id)
            assert spec is not None  # only jobs with a readable spec were placed
            planned.append(Planned(job_id, spec, kind, [(w, g) for _, w, g in sorted(placed)]))
    if live is not None:
        planned = live.confirm(planned)
    return [(p.job_id, p.nodes) for p in planned]


def _pools_from(store: Store) -> dict[str, WorkerIndex]:
    """Every ready worker read for this pass, by kind."""
    views = worker_snapshots(store, only_ready=True)
    return {kind: WorkerIndex(v.snapshot for v in views if v.kind == kind) for kind in _KINDS}


def _reserved_assignments(
    store: Store, jobs: list[JobRecord], pool: WorkerIndex, kind: str
) -> list[Planned]:
    """A cloud job runs only on the workers of the instances reserved for it, once they all
    joined, node rank r on node r's instance. The machines were chosen for the job, so worker
    pins in its spec name other workers."""
    rank_of = {i.request_id: i.node_rank for i in store.list_instances(live_only=True)}
    bound: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for r in store.live_reservations():
        if r.state == "bound" and r.worker_id is not None and r.worker_id in pool:
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
            a.worker_id: tuple(a.gpu_indices) for a in plan(queue, [pool.get(w) for w in workers])
        }
        if len(placed) == len(workers):
            decisions.append(Planned(job.id, spec, kind, [(w, placed[w]) for w in workers]))
    return decisions
