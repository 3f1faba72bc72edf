"""The pieces a :class:`~gpulayer.scheduler.index.WorkerIndex` is built of: worker classes
(signatures), their members, the buckets that keep members sorted per strategy, and the
cached plan of one class for one requirement key.

Kept apart from the index itself so the index module holds the registry and the queries
only; see :mod:`gpulayer.scheduler.index` for how these fit together.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Hashable
from typing import Any

from pydantic import BaseModel

from gpulayer.scheduler.feasibility import Condition
from gpulayer.scheduler.gpus import device_meets
from gpulayer.scheduler.snapshot import WorkerSnapshot
from gpulayer.scheduler.strategies import ORDERINGS, RankKey
from gpulayer.spec.capabilities import GpuDevice, WorkerCapabilities
from gpulayer.spec.models import ResourceRequest

PER_HOST_FIELDS: frozenset[str] = frozenset(
    {"hostname", "address", "zone", "hourly_price", "currency"}
)
"""Capability fields that differ from host to host and no static or load check reads."""
PER_DEVICE_FIELDS: frozenset[str] = frozenset({"uuid"})

_SIGNATURE_FIELDS = tuple(f for f in WorkerCapabilities.model_fields if f not in PER_HOST_FIELDS)
_DEVICE_FIELDS = tuple(f for f in GpuDevice.model_fields if f not in PER_DEVICE_FIELDS)


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


def core_level(cores: float) -> int:
    """0 below one core, then 1, 2, 3... for [1, 2), [2, 4), [4, 8)...: monotone in cores."""
    return int(max(cores, 0.0)).bit_length()


class Group:
    """One class: workers whose capabilities have the same signature."""

    __slots__ = ("alive", "buckets", "members", "ready", "representative", "signature")

    def __init__(self, sig: Hashable, representative: WorkerSnapshot) -> None:
        self.signature = sig
        self.representative = representative
        """The first member, idle: what class-level verdicts are judged on."""
        self.alive = True
        self.members: dict[str, Entry] = {}
        self.ready = Bucket()
        """Every ready member, whatever its free capacity."""
        self.buckets: dict[tuple[int, int], Bucket] = {}


class Entry:
    __slots__ = ("bucket", "group", "keys", "snap")

    def __init__(self, snap: WorkerSnapshot, group: Group) -> None:
        self.snap = snap
        self.group = group
        self.keys = {name: ordering(snap) for name, ordering in ORDERINGS.items()}
        self.bucket: tuple[int, int] | None = (
            (len(snap.free_gpus), core_level(snap.free_cpu_cores)) if snap.ready else None
        )


class Bucket:
    __slots__ = ("entries", "orders")

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self.orders: dict[str, list[RankKey]] = {}

    def ordered(self, ordering: str) -> list[RankKey]:
        keys = self.orders.get(ordering)
        if keys is None:
            keys = sorted(entry.keys[ordering] for entry in self.entries.values())
            self.orders[ordering] = keys
        return keys

    def insert(self, entry: Entry) -> None:
        self.entries[entry.snap.id] = entry
        for ordering, keys in self.orders.items():
            insort(keys, entry.keys[ordering])

    def discard(self, entry: Entry) -> None:
        del self.entries[entry.snap.id]
        for ordering, keys in self.orders.items():
            del keys[bisect_left(keys, entry.keys[ordering])]


class Plan:
    """One class's cached answer for one requirement key: it could run the job, given that
    these conditions hold on the worker now."""

    __slots__ = ("_tests", "conditions", "cores", "eligible", "gpus", "level", "ready")

    def __init__(self, conditions: tuple[Condition, ...], eligible: frozenset[int] | None):
        self.conditions = conditions
        self._tests = tuple(c.holds for c in conditions)
        self.ready = any(c.ready for c in conditions)
        self.gpus = max((c.gpus for c in conditions), default=0)
        self.cores = max((c.cores for c in conditions), default=0.0)
        self.level = core_level(self.cores)
        self.eligible = eligible
        """Device indices meeting every per-device field (None: all of them, or no GPU job):
        what :meth:`WorkerIndex.closest` counts a shortfall in."""

    def holds(self, snap: WorkerSnapshot) -> bool:
        return all(test(snap) for test in self._tests)


class KeyEntry:
    """The plans of every class that could run jobs of one requirement key."""

    __slots__ = ("plans", "seen")

    def __init__(self) -> None:
        self.plans: dict[Group, Plan] = {}
        self.seen = 0
        """How much of the index's log of added classes these plans have judged."""


def eligible_devices(resources: ResourceRequest, idle: WorkerSnapshot) -> frozenset[int] | None:
    if resources.gpus == 0:
        return None
    devices = idle.capabilities.gpus
    meeting = frozenset(gpu.index for gpu in devices if device_meets(resources, gpu))
    return None if len(meeting) == len(devices) else meeting
