"""Which of a worker's GPUs meet a request's per-device needs, and which ones a job gets."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from functools import lru_cache

from gpulayer.hardware.gpus import GpuName, any_gpu_matches, nominal_memory_gb, parse_gpu_name
from gpulayer.scheduler.snapshot import WorkerSnapshot
from gpulayer.spec.capabilities import GpuDevice
from gpulayer.spec.models import ResourceRequest


@lru_cache(maxsize=256)
def parse_capability(text: str | None) -> tuple[int, ...] | None:
    """ "8.6" -> (8, 6), so that 8.10 sorts above 8.6; None for a missing or malformed value."""
    if not text:
        return None
    try:
        return tuple(int(part) for part in text.strip().split("."))
    except ValueError:
        return None


def device_memory_gb(device: GpuDevice) -> float | None:
    """The device's nominal size (the GPU facts table's), not the few GB less it reports."""
    if device.memory_kind == "unified":
        return device.memory_gb  # shared with the host: what is reported is what there is
    return nominal_memory_gb(device.name, device.memory_gb)


def meets_memory(resources: ResourceRequest, device: GpuDevice) -> bool:
    need = resources.gpu_memory_gb
    if need is None:
        return True
    has = device_memory_gb(device)
    return has is not None and has >= need


@lru_cache(maxsize=256)
def wanted_models(names: tuple[str, ...]) -> tuple[GpuName, ...]:
    return tuple(parse_gpu_name(name) for name in names)


def meets_model(resources: ResourceRequest, device: GpuDevice) -> bool:
    if not resources.gpu_models:
        return True
    wanted = wanted_models(tuple(resources.gpu_models))
    return any_gpu_matches(wanted, device.name, device.memory_gb)


def meets_kind(resources: ResourceRequest, device: GpuDevice) -> bool:
    kind = resources.gpu_memory_kind
    return kind is None or device.memory_kind == kind


def meets_capability(resources: ResourceRequest, device: GpuDevice) -> bool:
    need = parse_capability(resources.min_cuda_compute_capability)
    if need is None:
        return True
    has = parse_capability(device.compute_capability)
    return has is not None and has >= need


def device_meets(resources: ResourceRequest, device: GpuDevice) -> bool:
    """Whether one device satisfies every per-device field of the request."""
    return (
        meets_model(resources, device)
        and meets_memory(resources, device)
        and meets_kind(resources, device)
        and meets_capability(resources, device)
    )


def free_devices(worker: WorkerSnapshot) -> list[GpuDevice]:
    free = set(worker.free_gpus)
    return [gpu for gpu in worker.capabilities.gpus if gpu.index in free]


def free_gpu_memory(worker: WorkerSnapshot) -> float:
    return sum(gpu.memory_gb or 0.0 for gpu in free_devices(worker))


def pick_gpus(resources: ResourceRequest, worker: WorkerSnapshot) -> tuple[int, ...] | None:
    """The free devices a job gets, or None when too few free ones meet the request.

    Smallest fitting devices first (memory, then compute capability, then index), so that
    larger and newer devices stay free for jobs that need them.
    """
    count = resources.gpus
    if count == 0:
        return ()
    fitting = [gpu for gpu in free_devices(worker) if device_meets(resources, gpu)]
    if len(fitting) < count:
        return None
    fitting.sort(
        key=lambda g: (g.memory_gb or 0.0, parse_capability(g.compute_capability) or (), g.index)
    )
    return tuple(sorted(gpu.index for gpu in fitting[:count]))


def describe_devices(
    devices: Iterable[GpuDevice], *, kind: bool = False, capability: bool = False
) -> str:
    """ "2 x NVIDIA A100 (80 GB), 1 x NVIDIA A10G (24 GB)", or "no GPUs"."""
    counts: Counter[str] = Counter()
    for gpu in devices:
        details = []
        if gpu.memory_gb is not None:
            details.append(f"{gpu.memory_gb:g} GB")
        if kind:
            details.append(gpu.memory_kind or "memory kind unknown")
        if capability:
            details.append(f"compute capability {gpu.compute_capability or 'unknown'}")
        label = gpu.name + (f" ({', '.join(details)})" if details else "")
        counts[label] += 1
    if not counts:
        return "no GPUs"
    return ", ".join(f"{n} x {label}" for label, n in counts.items())
