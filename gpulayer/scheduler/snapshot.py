"""What the scheduler knows about one worker at one moment: capabilities plus free capacity."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from gpulayer.scheduler.errors import InvalidSnapshot
from gpulayer.spec.capabilities import WorkerCapabilities

READY = "ready"
WORKER_STATES: frozenset[str] = frozenset({"ready", "draining", "leaving", "lost"})
"""States a worker reports. Only ready takes work; any other value is treated as not ready."""


@dataclass(frozen=True)
class WorkerSnapshot:
    id: str
    """Sortable: first_fit's "lowest worker id" is the sorted order of this string."""
    name: str
    labels: Mapping[str, str]
    capabilities: WorkerCapabilities
    state: str = READY
    free_gpus: tuple[int, ...] = ()
    """Indices of GPUs not given to a running job."""
    free_cpu_cores: float = 0
    free_memory_gb: float | None = None
    """None: host memory is not tracked, and the worker's total is compared instead."""
    running: int = 0
    _devices: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        devices = frozenset(gpu.index for gpu in self.capabilities.gpus)
        free = tuple(sorted(self.free_gpus))
        if len(set(free)) != len(free):
            raise InvalidSnapshot(f"worker {self.id}: free_gpus lists a GPU twice: {free}")
        unknown = [i for i in free if i not in devices]
        if unknown:
            raise InvalidSnapshot(
                f"worker {self.id}: free_gpus: GPU {unknown[0]} is not one of its GPUs "
                f"{tuple(sorted(devices))}"
            )
        if self.running < 0:
            raise InvalidSnapshot(f"worker {self.id}: running may not be negative")
        object.__setattr__(self, "free_gpus", free)
        object.__setattr__(self, "_devices", devices)
        if not isinstance(self.labels, MappingProxyType):
            object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))

    @property
    def ready(self) -> bool:
        return self.state == READY

    @property
    def host_memory_free(self) -> float | None:
        """Free host memory, or the total where free memory is not tracked."""
        if self.free_memory_gb is not None:
            return self.free_memory_gb
        return self.capabilities.memory_gb

    def idle(self) -> WorkerSnapshot:
        """The same worker with nothing running and ready: what it could ever offer."""
        caps = self.capabilities
        return replace(
            self,
            state=READY,
            free_gpus=tuple(sorted(self._devices)),
            free_cpu_cores=float(caps.cpu_cores),
            free_memory_gb=caps.memory_gb,
            running=0,
        )

    def take(
        self, gpu_indices: Iterable[int], cpu_cores: float, memory_gb: float | None
    ) -> WorkerSnapshot:
        """This worker after one more job starts with these GPUs, cores and memory."""
        taken = set(gpu_indices)
        missing = taken.difference(self.free_gpus)
        if missing:
            raise InvalidSnapshot(f"worker {self.id}: gpu_indices: GPU {min(missing)} is not free")
        memory = self.free_memory_gb
        if memory is not None and memory_gb is not None:
            memory -= memory_gb
        return replace(
            self,
            free_gpus=tuple(i for i in self.free_gpus if i not in taken),
            free_cpu_cores=self.free_cpu_cores - cpu_cores,
            free_memory_gb=memory,
            running=self.running + 1,
        )

    def release(
        self, gpu_indices: Iterable[int], cpu_cores: float, memory_gb: float | None
    ) -> WorkerSnapshot:
        """This worker after a job that held these GPUs, cores and memory ends."""
        returned = set(gpu_indices)
        clash = returned.intersection(self.free_gpus)
        if clash:
            raise InvalidSnapshot(
                f"worker {self.id}: gpu_indices: GPU {min(clash)} is already free"
            )
        unknown = returned.difference(self._devices)
        if unknown:
            raise InvalidSnapshot(
                f"worker {self.id}: gpu_indices: GPU {min(unknown)} is not one of its GPUs"
            )
        caps = self.capabilities
        memory = self.free_memory_gb
        if memory is not None and memory_gb is not None:
            memory += memory_gb
            if caps.memory_gb is not None:
                # Float sums drift; never report more than the worker has.
                memory = min(memory, caps.memory_gb)
        return replace(
            self,
            free_gpus=(*self.free_gpus, *returned),
            free_cpu_cores=min(self.free_cpu_cores + cpu_cores, float(caps.cpu_cores)),
            free_memory_gb=memory,
            running=max(self.running - 1, 0),
        )


def idle_snapshot(
    worker_id: str,
    capabilities: WorkerCapabilities,
    *,
    name: str | None = None,
    labels: Mapping[str, str] | None = None,
    state: str = READY,
) -> WorkerSnapshot:
    """A worker with nothing running: every GPU, core and GB free."""
    return WorkerSnapshot(
        id=worker_id,
        name=name if name is not None else worker_id,
        labels=labels or {},
        capabilities=capabilities,
        state=state,
        free_gpus=tuple(gpu.index for gpu in capabilities.gpus),
        free_cpu_cores=float(capabilities.cpu_cores),
        free_memory_gb=capabilities.memory_gb,
        running=0,
    )
