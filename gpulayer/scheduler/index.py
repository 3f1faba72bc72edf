"""WorkerIndex: placement without rescanning every worker for every job.

Workers that report the same hardware and software (the same *signature*: every capability
field but the per-host ones in :data:`PER_HOST_FIELDS`) form a group. A job's static and
load checks are judged once per group, on the group's idle representative, and that answer is
cached per job *shape* (the request fields checks read), so a 10,000-worker fleet with a few
dozen signatures costs a few dozen checks per new shape and nothing per repeat.

Inside a group, ready workers are kept sorted by each strategy's key (built the first time a
strategy asks), once for the whole group and once per bucket of equal (free GPU count,
free-core level). A job first tries the top few workers of each group's order: in a fleet
with room, the best-ranked worker usually fits, and a group whose best key cannot beat the
best found so far costs one comparison. Only when the top of a group is crowded with full
workers does it walk the buckets with enough free GPUs and cores, each in strategy order up
to the first fit. Updates move one worker in O(log n) search plus a list insert.

The answers equal a plain scan with :func:`~gpulayer.scheduler.feasibility.reasons_now` and
:func:`~gpulayer.scheduler.strategies.rank_key` over every worker (the tests compare both on
random fleets). That holds because static and load checks read only signature fields of
the worker's capabilities; a check that needs a per-host field must be identity-scoped.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Collection, Hashable, Iterable, Iterator, Sequence, Set
from typing import Any

from pydantic import BaseModel

from gpulayer.scheduler.errors import DuplicateWorker, UnknownWorker
from gpulayer.scheduler.feasibility import (
    CHECKS,
    Check,
    cpu_cores,
    gpu_count,
    gpu_devices,
    gpu_memory_gb,
    gpu_memory_kind,
    gpu_models,
    memory_gb,
    min_cuda_compute_capability,
    state,
    worker_ids,
    worker_labels,
)
from gpulayer.scheduler.gpus import device_meets, pick_gpus
from gpulayer.scheduler.outcome import Explanation, Placement
from gpulayer.scheduler.snapshot import WorkerSnapshot
from gpulayer.scheduler.strategies import ORDERINGS, RankKey, ordering_for
from gpulayer.spec.capabilities import GpuDevice, WorkerCapabilities
from gpulayer.spec.models import JobSpec, ResourceRequest

PER_HOST_FIELDS: frozenset[str] = frozenset(
    {"hostname", "address", "zone", "hourly_price", "currency"}
)
"""Capability fields that differ from host to host and no static or load check reads."""
PER_DEVICE_FIELDS: frozenset[str] = frozenset({"uuid"})

_SIGNATURE_FIELDS = tuple(f for f in WorkerCapabilities.model_fields if f not in PER_HOST_FIELDS)
_DEVICE_FIELDS = tuple(f for f in GpuDevice.model_fields if f not in PER_DEVICE_FIELDS)

# Checks the index answers from its own structures in "now" mode; any other non-static check
# in the chain is called per candidate worker.
_NATIVE: frozenset[Check] = frozenset(
    {
        state,
        worker_ids,
        worker_labels,
        gpu_count,
        gpu_models,
        gpu_memory_gb,
        gpu_memory_kind,
        min_cuda_compute_capability,
        gpu_devices,
        cpu_cores,
        memory_gb,
    }
)
# Below this many label/id candidates, judging each one beats walking the buckets.
_FEW_CANDIDATES = 32
# Workers tried from the top of a group's order before narrowing to buckets with room: in a
# fleet that is not full, the best-ranked worker of a group usually fits.
_PROBES = 8
_SHAPE_CACHE_LIMIT = 4096


def _freeze(value: Any) -> Hashable:
    if isinstance(value, GpuDevice):
        return tuple(_freeze(getattr(value, f)) for f in _DEVICE_FIELDS)
    if isinstance(value, BaseModel):
        return tuple(sorted((k, _freeze(v)) for k, v in value.model_dump().items()))
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def signature(capabilities: WorkerCapabilities) -> Hashable:
    """What workers must share to be judged as one: every field but the per-host ones."""
    return tuple(_freeze(getattr(capabilities, f)) for f in _SIGNATURE_FIELDS)


def job_shape(job: JobSpec) -> Hashable:
    """The request fields static and load checks read; equal shapes get equal group answers."""
    r = job.resources
    p = job.placement
    return (
        r.accelerator,
        r.gpus,
        tuple(r.gpu_models),
        r.gpu_memory_gb,
        r.gpu_memory_kind,
        r.min_cuda_compute_capability,
        r.cpu_cores,
        r.memory_gb,
        r.disk_gb,
        tuple(r.os),
        tuple(r.cpu_arch),
        tuple(sorted(r.frameworks.items())),
        r.python,
        tuple(p.providers),
        tuple(p.regions),
    )


def fit_key(job: JobSpec) -> Hashable:
    """Jobs with equal keys fit exactly the same workers (strategy only changes the order)."""
    p = job.placement
    return (job_shape(job), tuple(sorted(p.worker_ids)), tuple(sorted(p.worker_labels.items())))


def _core_level(cores: float) -> int:
    """0 below one core, then 1, 2, 3... for [1, 2), [2, 4), [4, 8)...: monotone in cores."""
    return int(max(cores, 0.0)).bit_length()


class _Group:
    __slots__ = ("buckets", "members", "ready", "representative", "signature")

    def __init__(self, sig: Hashable, representative: WorkerSnapshot) -> None:
        self.signature = sig
        self.representative = representative
        self.members: dict[str, _Entry] = {}
        self.ready = _Bucket()
        """Every ready member, whatever its free capacity."""
        self.buckets: dict[tuple[int, int], _Bucket] = {}


class _Entry:
    __slots__ = ("bucket", "group", "keys", "snap")

    def __init__(self, snap: WorkerSnapshot, group: _Group) -> None:
        self.snap = snap
        self.group = group
        self.keys = {name: ordering(snap) for name, ordering in ORDERINGS.items()}
        self.bucket: tuple[int, int] | None = (
            (len(snap.free_gpus), _core_level(snap.free_cpu_cores)) if snap.ready else None
        )


class _Bucket:
    __slots__ = ("entries", "orders")

    def __init__(self) -> None:
        self.entries: dict[str, _Entry] = {}
        self.orders: dict[str, list[RankKey]] = {}

    def ordered(self, ordering: str) -> list[RankKey]:
        keys = self.orders.get(ordering)
        if keys is None:
            keys = sorted(entry.keys[ordering] for entry in self.entries.values())
            self.orders[ordering] = keys
        return keys

    def insert(self, entry: _Entry) -> None:
        self.entries[entry.snap.id] = entry
        for ordering, keys in self.orders.items():
            insort(keys, entry.keys[ordering])

    def discard(self, entry: _Entry) -> None:
        del self.entries[entry.snap.id]
        for ordering, keys in self.orders.items():
            del keys[bisect_left(keys, entry.keys[ordering])]


_Feasible = dict[_Group, "frozenset[int] | None"]
"""Groups that could ever run a shape, each with the device indices meeting its per-device
fields (None: all of the group's devices do, or the job needs none)."""


class WorkerIndex:
    """Registered workers, grouped and sorted for fast placement; updated one worker at a time.

    ``extra_checks`` are appended to the default chain :data:`CHECKS`.
    """

    def __init__(
        self, workers: Iterable[WorkerSnapshot] = (), *, extra_checks: Sequence[Check] = ()
    ) -> None:
        self.checks: tuple[Check, ...] = (*CHECKS, *extra_checks)
        self._group_checks = tuple(c for c in self.checks if c.scope != "identity")
        self._per_worker = tuple(c for c in self.checks if c.scope != "static" and c not in _NATIVE)
        self._per_worker_identity = tuple(c for c in self._per_worker if c.scope == "identity")
        self._entries: dict[str, _Entry] = {}
        self._groups: dict[Hashable, _Group] = {}
        self._labels: dict[tuple[str, str], set[str]] = {}
        self._feasible: dict[Hashable, _Feasible] = {}
        for worker in workers:
            self.add(worker)

    # --- registry ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, worker_id: object) -> bool:
        return worker_id in self._entries

    def __iter__(self) -> Iterator[WorkerSnapshot]:
        return (entry.snap for entry in self._entries.values())

    @property
    def group_count(self) -> int:
        return len(self._groups)

    @property
    def has_extra_checks(self) -> bool:
        return len(self.checks) > len(CHECKS)

    def get(self, worker_id: str) -> WorkerSnapshot:
        return self._entry(worker_id).snap

    def add(self, worker: WorkerSnapshot) -> None:
        if worker.id in self._entries:
            raise DuplicateWorker(f"worker {worker.id}: already in the index; use update")
        sig = signature(worker.capabilities)
        group = self._groups.get(sig)
        if group is None:
            group = _Group(sig, worker.idle())
            self._groups[sig] = group
            self._feasible.clear()  # cached answers do not know the new group
        self._insert(_Entry(worker, group))
        for pair in worker.labels.items():
            self._labels.setdefault(pair, set()).add(worker.id)

    def remove(self, worker_id: str) -> WorkerSnapshot:
        entry = self._entry(worker_id)
        self._unlink(entry)
        del self._entries[worker_id]
        group = entry.group
        if not group.members:
            del self._groups[group.signature]
            self._feasible.clear()
        for pair in entry.snap.labels.items():
            holders = self._labels[pair]
            holders.discard(worker_id)
            if not holders:
                del self._labels[pair]
        return entry.snap

    def update(self, worker: WorkerSnapshot) -> None:
        """Replace a worker's snapshot (new load, state, labels or capabilities)."""
        old = self._entry(worker.id)
        same_labels = worker.labels is old.snap.labels or worker.labels == old.snap.labels
        same_hardware = worker.capabilities is old.snap.capabilities or (
            signature(worker.capabilities) == old.group.signature
        )
        if not (same_labels and same_hardware):
            self.remove(worker.id)
            self.add(worker)
            return
        self._unlink(old)
        self._insert(_Entry(worker, old.group))

    def assign(self, job: JobSpec, placement: Placement) -> WorkerSnapshot:
        """Mark the job's GPUs, cores and memory as taken on the placed worker."""
        r = job.resources
        snap = self.get(placement.worker_id).take(placement.gpu_indices, r.cpu_cores, r.memory_gb)
        self.update(snap)
        return snap

    def release(self, job: JobSpec, placement: Placement) -> WorkerSnapshot:
        """Give back what :meth:`assign` took once the job ends."""
        r = job.resources
        snap = self.get(placement.worker_id).release(
            placement.gpu_indices, r.cpu_cores, r.memory_gb
        )
        self.update(snap)
        return snap

    def _entry(self, worker_id: str) -> _Entry:
        entry = self._entries.get(worker_id)
        if entry is None:
            raise UnknownWorker(f"worker {worker_id}: not in the index")
        return entry

    def _insert(self, entry: _Entry) -> None:
        worker_id = entry.snap.id
        self._entries[worker_id] = entry
        entry.group.members[worker_id] = entry
        if entry.bucket is not None:
            entry.group.ready.insert(entry)
            buckets = entry.group.buckets
            bucket = buckets.get(entry.bucket)
            if bucket is None:
                bucket = buckets[entry.bucket] = _Bucket()
            bucket.insert(entry)

    def _unlink(self, entry: _Entry) -> None:
        group = entry.group
        del group.members[entry.snap.id]
        if entry.bucket is not None:
            group.ready.discard(entry)
            bucket = group.buckets[entry.bucket]
            bucket.discard(entry)
            if not bucket.entries:
                del group.buckets[entry.bucket]

    # --- queries ----------------------------------------------------------------------------

    def choose(self, job: JobSpec, *, exclude: Collection[str] = frozenset()) -> Placement | None:
        """The best worker that can take the job now under its strategy, and its GPUs."""
        entry = self._best(job, exclude)
        if entry is None:
            return None
        gpus = pick_gpus(job.resources, entry.snap)
        if gpus is None:  # _fits counted the same devices; a mismatch is a bug here
            raise AssertionError(f"worker {entry.snap.id}: chosen without enough fitting GPUs")
        return Placement(entry.snap.id, gpus)

    def could_ever_run(self, job: JobSpec) -> bool:
        """Whether some worker (in any state, whatever its load) could run the job."""
        feasible = self._feasible_groups(job)
        if not feasible:
            return False
        candidates = self._candidates(job)
        if candidates is None and not self._per_worker_identity:
            return True
        return any(
            self._identity_ok(job, entry.snap) for entry in self._entries_in(feasible, candidates)
        )

    def closest(self, job: JobSpec, *, exclude: Collection[str] = frozenset()) -> str | None:
        """The ready worker nearest to fitting the job: smallest shortfall in fitting GPUs,
        then cores, then memory; then fewest running jobs, then id. Visits every candidate."""
        feasible = self._feasible_groups(job)
        r = job.resources
        best: tuple[Any, ...] | None = None
        for entry in self._entries_in(feasible, self._candidates(job)):
            snap = entry.snap
            if not snap.ready or snap.id in exclude or not self._identity_ok(job, snap):
                continue
            eligible = feasible[entry.group]
            usable = len(snap.free_gpus) if eligible is None else _count_in(snap, eligible)
            free_memory = snap.host_memory_free or 0.0
            key = (
                max(r.gpus - usable, 0),
                max(r.cpu_cores - snap.free_cpu_cores, 0.0),
                max((r.memory_gb or 0.0) - free_memory, 0.0),
                snap.running,
                snap.id,
            )
            if best is None or key < best:
                best = key
        return None if best is None else str(best[-1])

    def explain(self, job: JobSpec) -> Explanation:
        """Per worker, the reasons of reasons_now and reasons_never, judging group-wide checks
        once per group."""
        now: dict[str, list[str]] = {}
        never: dict[str, list[str]] = {}
        for group in self._groups.values():
            idle = group.representative
            on_idle = [c(job, idle) if c.scope != "identity" else None for c in self.checks]
            for worker_id, entry in group.members.items():
                snap = entry.snap
                reasons_now: list[str] = []
                reasons_never: list[str] = []
                for chk, idle_reason in zip(self.checks, on_idle, strict=True):
                    if chk.scope == "static":
                        current = idle_reason
                    else:
                        current = chk(job, snap)
                        if chk.scope == "identity":
                            idle_reason = current
                    if current is not None:
                        reasons_now.append(current)
                    if idle_reason is not None:
                        reasons_never.append(idle_reason)
                now[worker_id] = reasons_now
                never[worker_id] = reasons_never
        return Explanation(now=now, never=never)

    # --- internals --------------------------------------------------------------------------

    def _feasible_groups(self, job: JobSpec) -> _Feasible:
        shape = job_shape(job)
        found = self._feasible.get(shape)
        if found is not None:
            return found
        found = {}
        for group in self._groups.values():
            idle = group.representative
            if all(chk(job, idle) is None for chk in self._group_checks):
                found[group] = _eligible_devices(job.resources, idle)
        if len(self._feasible) >= _SHAPE_CACHE_LIMIT:
            self._feasible.clear()
        self._feasible[shape] = found
        return found

    def _candidates(self, job: JobSpec) -> Set[str] | None:
        """Worker ids allowed by worker_ids and worker_labels; None when neither is set."""
        pinned = job.placement.worker_ids
        labels = job.placement.worker_labels
        if not pinned and not labels:
            return None
        sets: list[Set[str]] = []
        if pinned:
            sets.append({w for w in pinned if w in self._entries})
        for pair in labels.items():
            holders = self._labels.get(pair)
            if not holders:
                return frozenset()
            sets.append(holders)
        sets.sort(key=len)
        if len(sets) == 1:
            return sets[0]
        return set(sets[0]).intersection(*sets[1:])

    def _entries_in(self, feasible: _Feasible, candidates: Set[str] | None) -> Iterator[_Entry]:
        if candidates is None:
            for group in feasible:
                yield from group.members.values()
            return
        for worker_id in candidates:
            entry = self._entries[worker_id]
            if entry.group in feasible:
                yield entry

    def _identity_ok(self, job: JobSpec, snap: WorkerSnapshot) -> bool:
        return all(chk(job, snap) is None for chk in self._per_worker_identity)

    def _fits(self, job: JobSpec, snap: WorkerSnapshot, eligible: frozenset[int] | None) -> bool:
        r = job.resources
        if not snap.ready or snap.free_cpu_cores < r.cpu_cores:
            return False
        if r.memory_gb is not None:
            free_memory = snap.host_memory_free
            if free_memory is None or free_memory < r.memory_gb:
                return False
        if r.gpus:
            usable = len(snap.free_gpus) if eligible is None else _count_in(snap, eligible)
            if usable < r.gpus:
                return False
        return all(chk(job, snap) is None for chk in self._per_worker)

    def _best(self, job: JobSpec, exclude: Collection[str]) -> _Entry | None:
        feasible = self._feasible_groups(job)
        if not feasible:
            return None
        ordering = ordering_for(job)
        candidates = self._candidates(job)
        best: _Entry | None = None
        best_key: RankKey | None = None
        if candidates is not None and len(candidates) <= _FEW_CANDIDATES:
            for entry in self._entries_in(feasible, candidates):
                key = entry.keys[ordering]
                if best_key is not None and key >= best_key:
                    continue
                if entry.snap.id in exclude or not self._fits(
                    job, entry.snap, feasible[entry.group]
                ):
                    continue
                best, best_key = entry, key
            return best
        gpus = job.resources.gpus
        level = _core_level(job.resources.cpu_cores)
        for group, eligible in feasible.items():
            top = group.ready.ordered(ordering)
            if not top or (best_key is not None and top[0] >= best_key):
                continue  # no ready member, or none that could beat the best so far
            rooms = [
                bucket
                for (free_gpus, core_level), bucket in group.buckets.items()
                if free_gpus >= gpus and core_level >= level
            ]
            if not rooms:
                continue
            if len(rooms) > 1:
                # The top of the group's whole order first: the first fit there is the group's
                # best. Only when the top is crowded with full workers, walk the buckets with
                # room one by one.
                found, settled = self._probe(
                    job, group, eligible, ordering, best_key, exclude, candidates, gpus, level
                )
                if found is not None:
                    best, best_key = found, found.keys[ordering]
                if settled:
                    continue
            for bucket in rooms:
                for key in bucket.ordered(ordering):
                    if best_key is not None and key >= best_key:
                        break
                    worker_id = key[-1]
                    if worker_id in exclude or (
                        candidates is not None and worker_id not in candidates
                    ):
                        continue
                    entry = bucket.entries[worker_id]
                    if self._fits(job, entry.snap, eligible):
                        best, best_key = entry, key
                        break
        return best

    def _probe(
        self,
        job: JobSpec,
        group: _Group,
        eligible: frozenset[int] | None,
        ordering: str,
        best_key: RankKey | None,
        exclude: Collection[str],
        candidates: Set[str] | None,
        gpus: int,
        level: int,
    ) -> tuple[_Entry | None, bool]:
        """The group's best fitting worker if it is near the top of the group's order, and
        whether the top settled the group (a fit, a key that cannot win, or the end)."""
        probed = 0
        for key in group.ready.ordered(ordering):
            if best_key is not None and key >= best_key:
                return None, True
            if probed == _PROBES:
                return None, False
            probed += 1
            worker_id = key[-1]
            if worker_id in exclude or (candidates is not None and worker_id not in candidates):
                continue
            entry = group.members[worker_id]
            room = entry.bucket
            if room is None or room[0] < gpus or room[1] < level:
                continue
            if self._fits(job, entry.snap, eligible):
                return entry, True
        return None, True


def _eligible_devices(resources: ResourceRequest, idle: WorkerSnapshot) -> frozenset[int] | None:
    if resources.gpus == 0:
        return None
    devices = idle.capabilities.gpus
    meeting = frozenset(gpu.index for gpu in devices if device_meets(resources, gpu))
    return None if len(meeting) == len(devices) else meeting


def _count_in(snap: WorkerSnapshot, eligible: frozenset[int]) -> int:
    return sum(1 for index in snap.free_gpus if index in eligible)
