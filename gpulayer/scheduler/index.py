"""WorkerIndex: placement as a cache over the feasibility checks.

Workers that report the same hardware and software (the same *signature*: every capability
field but the per-host ones in :data:`PER_HOST_FIELDS`) form a class, as Nomad's computed
node classes do. Each check's first stage (see :mod:`gpulayer.scheduler.feasibility`) is
judged once per class and job *requirement key* (the job fields the checks declare they
read) on the class's idle representative, and cached: a class any static check rejects, or
that could not take the job even idle, is left out; for the others the cache keeps the load
checks' :class:`~gpulayer.scheduler.feasibility.Condition`s, the only per-worker work left.
A 10,000-worker fleet with a few dozen classes thus costs a few dozen first stages per new
key and nothing per repeat; a new class costs one first stage per cached key, judged when a
key next asks; a worker's load or state change costs its own re-sort only.

Inside a class, ready workers are kept sorted by each strategy's key (built the first time a
strategy asks), once for the whole class and once per bucket of equal (free GPU count,
free-core level). A job first tries the top few workers of each class's order: in a fleet
with room, the best-ranked worker usually fits, and a class whose best key cannot beat the
best found so far costs one comparison. Only when the top of a class is crowded with full
workers does it walk the buckets that the conditions' bounds (ready, free GPUs, free cores)
allow, each in strategy order up to the first fit. Every worker chosen is one whose
conditions and identity checks all hold, the same calls the plain scan makes.

The answers equal a plain scan with :func:`~gpulayer.scheduler.feasibility.reasons_now` and
:func:`~gpulayer.scheduler.strategies.rank_key` over every worker (the tests compare both on
random fleets). That holds because static and load checks read only signature fields of
the worker's capabilities in their first stage; a check that needs a per-host field must be
identity-scoped.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable, Iterator, Sequence, Set
from typing import Any

from gpulayer.scheduler.errors import DuplicateWorker, UnknownWorker
from gpulayer.scheduler.feasibility import (
    CHECKS,
    Check,
    Condition,
    count_free_in,
    key_reader,
    outcome,
)
from gpulayer.scheduler.gpus import pick_gpus

# The building blocks live in index_parts (this module keeps the registry and the queries);
# the short private names keep the code below reading as it did.
from gpulayer.scheduler.index_parts import PER_DEVICE_FIELDS as PER_DEVICE_FIELDS
from gpulayer.scheduler.index_parts import PER_HOST_FIELDS as PER_HOST_FIELDS
from gpulayer.scheduler.index_parts import Bucket as _Bucket
from gpulayer.scheduler.index_parts import Entry as _Entry
from gpulayer.scheduler.index_parts import Group as _Group
from gpulayer.scheduler.index_parts import KeyEntry as _KeyEntry
from gpulayer.scheduler.index_parts import Plan as _Plan
from gpulayer.scheduler.index_parts import eligible_devices as _eligible_devices
from gpulayer.scheduler.index_parts import signature as signature
from gpulayer.scheduler.outcome import Explanation, Placement
from gpulayer.scheduler.snapshot import WorkerSnapshot
from gpulayer.scheduler.strategies import RankKey, ordering_for
from gpulayer.spec.models import DistributedWorkload, JobSpec

# Below this many label/id candidates, judging each one beats walking the buckets.
_FEW_CANDIDATES = 32
# Workers tried from the top of a class's order before narrowing to buckets with room: in a
# fleet that is not full, the best-ranked worker of a class usually fits.
_PROBES = 8
_KEY_CACHE_LIMIT = 4096
# Specs whose fit keys an index remembers; past that it starts over (a key is cheap to read
# again, only not for every queued job on every pass).
_FIT_KEYS_KEPT = 8192


def node_count(job: JobSpec) -> int:
    """How many workers the job needs at once: num_workers for a distributed job, else 1."""
    workload = job.workload
    return workload.num_workers if isinstance(workload, DistributedWorkload) else 1


class WorkerIndex:
    """Registered workers, grouped by class and sorted for fast placement; updated one worker
    at a time.

    ``extra_checks`` are appended to the default chain :data:`CHECKS`.
    """

    def __init__(
        self, workers: Iterable[WorkerSnapshot] = (), *, extra_checks: Sequence[Check] = ()
    ) -> None:
        self.checks: tuple[Check, ...] = (*CHECKS, *extra_checks)
        self._class_checks = tuple(c for c in self.checks if c.scope != "identity")
        self._identity_checks = tuple(c for c in self.checks if c.scope == "identity")
        self._class_key = key_reader(self._class_checks)
        self._fit_key = key_reader(self.checks)
        self._fit_keys: dict[int, tuple[JobSpec, tuple[Hashable, int]]] = {}
        """Per spec object, its pass key (see pass_key)."""
        self._entries: dict[str, _Entry] = {}
        self._groups: dict[Hashable, _Group] = {}
        self._labels: dict[tuple[str, str], set[str]] = {}
        self._keys: dict[Hashable, _KeyEntry] = {}
        self._added: list[_Group] = []
        """Every class in the order it appeared; cached keys judge the ones they have not."""
        self.with_free_cores = 0
        """Workers with a CPU core (or part of one) free: with none, no job fits anywhere
        (every job asks for some cores), so a pass need not look at the rest of its queue."""
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

    def fit_key(self, job: JobSpec) -> Hashable:
        """Jobs with equal keys fit exactly the same workers (strategy only changes the order):
        the values of every job field the chain reads."""
        return self.pass_key(job)[0]

    def pass_key(self, job: JobSpec) -> tuple[Hashable, int]:
        """The job's fit key and its node count: jobs with equal pass keys find room, or none,
        alike within a scheduling pass. Kept per spec object: a pass asks for the key of every
        queued job, and the control plane hands the same validated spec to pass after pass."""
        known = self._fit_keys.get(id(job))
        if known is not None and known[0] is job:
            return known[1]
        key = (self._fit_key(job), node_count(job))
        if len(self._fit_keys) >= _FIT_KEYS_KEPT:
            self._fit_keys.clear()
        self._fit_keys[id(job)] = (job, key)
        return key

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
            self._added.append(group)  # judged for each cached key when that key next asks
        self._insert(_Entry(worker, group))
        for pair in worker.labels.items():
            self._labels.setdefault(pair, set()).add(worker.id)

    def remove(self, worker_id: str) -> WorkerSnapshot:
        entry = self._entry(worker_id)
        self._unlink(entry)
        del self._entries[worker_id]
        group = entry.group
        if not group.members:
            self._drop_group(group)
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

    def put(self, worker: WorkerSnapshot) -> None:
        """Add the worker, or replace the snapshot of one already in the index."""
        if worker.id in self._entries:
            self.update(worker)
        else:
            self.add(worker)

    def discard(self, worker_id: str) -> None:
        """Remove the worker if it is in the index."""
        if worker_id in self._entries:
            self.remove(worker_id)

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
        if entry.snap.free_cpu_cores > 0:
            self.with_free_cores += 1
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
        if entry.snap.free_cpu_cores > 0:
            self.with_free_cores -= 1
        if entry.bucket is not None:
            group.ready.discard(entry)
            bucket = group.buckets[entry.bucket]
            bucket.discard(entry)
            if not bucket.entries:
                del group.buckets[entry.bucket]

    def _drop_group(self, group: _Group) -> None:
        del self._groups[group.signature]
        group.alive = False
        for cached in self._keys.values():
            cached.plans.pop(group, None)
        if len(self._added) > 2 * len(self._groups) + 64:
            # Classes come and go with churn: start the log (and the cache) afresh.
            self._added = list(self._groups.values())
            self._keys.clear()

    # --- queries ----------------------------------------------------------------------------

    def choose(self, job: JobSpec, *, exclude: Collection[str] = frozenset()) -> Placement | None:
        """The best worker that can take the job now under its strategy, and its GPUs."""
        entry = self._best(job, exclude)
        if entry is None:
            return None
        gpus = pick_gpus(job.resources, entry.snap)
        if gpus is None:  # the GPU conditions counted the same devices; a mismatch is a bug
            raise AssertionError(f"worker {entry.snap.id}: chosen without enough fitting GPUs")
        return Placement(entry.snap.id, gpus)

    def could_ever_run(self, job: JobSpec) -> bool:
        """Whether some worker (in any state, whatever its load) could run the job."""
        plans = self._plans(job)
        if not plans:
            return False
        candidates = _candidates(job, self._entries, self._labels)
        return any(
            self._identity_ok(job, entry.snap)
            for entry in _entries_in(self._entries, plans, candidates)
        )

    def closest(self, job: JobSpec, *, exclude: Collection[str] = frozenset()) -> str | None:
        """The ready worker nearest to fitting the job: smallest shortfall in fitting GPUs,
        then cores, then memory; then fewest running jobs, then id. Visits every candidate."""
        plans = self._plans(job)
        r = job.resources
        best: tuple[Any, ...] | None = None
        for entry in _entries_in(
            self._entries, plans, _candidates(job, self._entries, self._labels)
        ):
            snap = entry.snap
            if not snap.ready or snap.id in exclude or not self._identity_ok(job, snap):
                continue
            eligible = plans[entry.group].eligible
            usable = len(snap.free_gpus) if eligible is None else count_free_in(snap, eligible)
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
        """Per worker, the reasons of reasons_now and reasons_never, judging each check's
        first stage once per class."""
        now: dict[str, list[str]] = {}
        never: dict[str, list[str]] = {}
        for group in self._groups.values():
            idle = group.representative
            verdicts = [
                None if c.scope == "identity" else c.verdict(job, idle) for c in self.checks
            ]
            on_idle = [outcome(verdict, idle) for verdict in verdicts]
            for worker_id, entry in group.members.items():
                snap = entry.snap
                reasons_now: list[str] = []
                reasons_never: list[str] = []
                for chk, verdict, idle_reason in zip(self.checks, verdicts, on_idle, strict=True):
                    if chk.scope == "identity":
                        current = idle_reason = chk(job, snap)
                    else:
                        current = outcome(verdict, snap)
                    if current is not None:
                        reasons_now.append(current)
                    if idle_reason is not None:
                        reasons_never.append(idle_reason)
                now[worker_id] = reasons_now
                never[worker_id] = reasons_never
        return Explanation(now=now, never=never)

    # --- the class-level cache --------------------------------------------------------------

    def _plans(self, job: JobSpec) -> dict[_Group, _Plan]:
        """The classes that could ever run the job, each with what it asks of a worker now."""
        key = self._class_key(job)
        cached = self._keys.get(key)
        if cached is None:
            if len(self._keys) >= _KEY_CACHE_LIMIT:
                self._keys.clear()
            cached = self._keys[key] = _KeyEntry()
        if cached.seen < len(self._added):
            for group in self._added[cached.seen :]:
                if group.alive:
                    plan = self._judge(job, group)
                    if plan is not None:
                        cached.plans[group] = plan
            cached.seen = len(self._added)
        return cached.plans

    def _judge(self, job: JobSpec, group: _Group) -> _Plan | None:
        """Every static and load check's first stage on the class, once; None when one of
        them says no, or a condition fails even with the whole worker free."""
        idle = group.representative
        conditions: list[Condition] = []
        for chk in self._class_checks:
            verdict = chk.verdict(job, idle)
            if verdict is None:
                continue
            if isinstance(verdict, str) or not verdict.holds(idle):
                return None
            conditions.append(verdict)
        return _Plan(tuple(conditions), _eligible_devices(job.resources, idle))

    # --- internals --------------------------------------------------------------------------

    def _identity_ok(self, job: JobSpec, snap: WorkerSnapshot) -> bool:
        return all(outcome(c.function(job, snap), snap) is None for c in self._identity_checks)

    def _fits(self, job: JobSpec, snap: WorkerSnapshot, plan: _Plan) -> bool:
        return plan.holds(snap) and self._identity_ok(job, snap)

    def _best(self, job: JobSpec, exclude: Collection[str]) -> _Entry | None:
        plans = self._plans(job)
        if not plans:
            return None
        ordering = ordering_for(job)
        candidates = _candidates(job, self._entries, self._labels)
        best: _Entry | None = None
        best_key: RankKey | None = None
        if candidates is not None and len(candidates) <= _FEW_CANDIDATES:
            for entry in _entries_in(self._entries, plans, candidates):
                key = entry.keys[ordering]
                if best_key is not None and key >= best_key:
                    continue
                if entry.snap.id in exclude or not self._fits(job, entry.snap, plans[entry.group]):
                    continue
                best, best_key = entry, key
            return best
        for group, plan in plans.items():
            if not plan.ready:
                # No condition promises readiness, so buckets (ready workers only) do not
                # cover the class: judge each member.
                for entry in group.members.values():
                    key = entry.keys[ordering]
                    if best_key is not None and key >= best_key:
                        continue
                    if entry.snap.id in exclude or (
                        candidates is not None and entry.snap.id not in candidates
                    ):
                        continue
                    if self._fits(job, entry.snap, plan):
                        best, best_key = entry, key
                continue
            top = group.ready.ordered(ordering)
            if not top or (best_key is not None and top[0] >= best_key):
                continue  # no ready member, or none that could beat the best so far
            rooms = [
                bucket
                for (free_gpus, core_level), bucket in group.buckets.items()
                if free_gpus >= plan.gpus and core_level >= plan.level
            ]
            if not rooms:
                continue
            if len(rooms) > 1:
                # The top of the class's whole order first: the first fit there is the class's
                # best. Only when the top is crowded with full workers, walk the buckets with
                # room one by one.
                found, settled = self._probe(
                    job, group, plan, ordering, best_key, exclude, candidates
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
                    if self._fits(job, entry.snap, plan):
                        best, best_key = entry, key
                        break
        return best

    def _probe(
        self,
        job: JobSpec,
        group: _Group,
        plan: _Plan,
        ordering: str,
        best_key: RankKey | None,
        exclude: Collection[str],
        candidates: Set[str] | None,
    ) -> tuple[_Entry | None, bool]:
        """The class's best fitting worker if it is near the top of the class's order, and
        whether the top settled the class (a fit, a key that cannot win, or the end)."""
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
            if room is None or room[0] < plan.gpus or room[1] < plan.level:
                continue
            if self._fits(job, entry.snap, plan):
                return entry, True
        return None, True


# Module functions rather than methods: they read only the dicts handed to them, and keep
# WorkerIndex within the class size limit.


def _candidates(
    job: JobSpec, entries: Collection[str], by_label: dict[tuple[str, str], set[str]]
) -> Set[str] | None:
    """Worker ids that worker_ids and worker_labels could accept (a lookup that narrows
    the search; those checks still judge each candidate); None when neither is set."""
    pinned = job.placement.worker_ids
    labels = job.placement.worker_labels
    if not pinned and not labels:
        return None
    sets: list[Set[str]] = []
    if pinned:
        sets.append({w for w in pinned if w in entries})
    for pair in labels.items():
        holders = by_label.get(pair)
        if not holders:
            return frozenset()
        sets.append(holders)
    sets.sort(key=len)
    if len(sets) == 1:
        return sets[0]
    return set(sets[0]).intersection(*sets[1:])


def _entries_in(
    entries: dict[str, _Entry], plans: dict[_Group, _Plan], candidates: Set[str] | None
) -> Iterator[_Entry]:
    if candidates is None:
        for group in plans:
            yield from group.members.values()
        return
    for worker_id in candidates:
        entry = entries[worker_id]
        if entry.group in plans:
            yield entry
