"""Instance types and the zones that have them, from describe_instance_types and
describe_instance_type_offerings."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# EC2 names architectures its own way; gpulayer uses the kernel's names.
_ARCHES = {"x86_64": "x86_64", "arm64": "aarch64"}


@dataclass(frozen=True)
class Shape:
    """The hardware of one instance type."""

    name: str
    vcpus: int
    memory_gb: float
    cpu_arch: str
    gpu_name: str | None = None
    gpu_maker: str | None = None
    gpu_count: int = 0
    gpu_memory_gb: float | None = None
    """Per GPU."""
    gpu_slice: float | None = None
    """Each GPU is this part of one physical GPU (g6f: 0.125 to 0.5 of an L4); None: whole."""

    @property
    def nvidia(self) -> bool:
        return self.gpu_count > 0 and (self.gpu_maker or "").upper() == "NVIDIA"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Shape:
        return cls(**data)


def slice_of_gpu(part: float | None) -> float | None:
    """An EC2 GPU partition size as a slice: None for a whole GPU (1.0, or not said)."""
    return part if part is not None and 0 < part < 1 else None


def shape_from_api(item: dict[str, Any]) -> Shape | None:
    """A describe_instance_types entry as a Shape; None for types gpulayer cannot use
    (Mac hosts, no supported architecture)."""
    arches = item.get("ProcessorInfo", {}).get("SupportedArchitectures", [])
    arch = next((_ARCHES[a] for a in arches if a in _ARCHES), None)
    if arch is None:
        return None
    vcpus = int(item.get("VCpuInfo", {}).get("DefaultVCpus", 0))
    memory_mib = float(item.get("MemoryInfo", {}).get("SizeInMiB", 0))
    if vcpus <= 0 or memory_mib <= 0:
        return None
    gpus = item.get("GpuInfo", {}).get("Gpus", [])
    if not gpus:
        return Shape(item["InstanceType"], vcpus, round(memory_mib / 1024, 2), arch)
    first = gpus[0]
    # A slice of one GPU (g6f) is no whole GPU (Count 0) but one device (LogicalGpuCount 1).
    part = slice_of_gpu(first.get("GpuPartitionSize"))
    count = sum(int(g.get("LogicalGpuCount" if part else "Count", 0)) for g in gpus)
    if count <= 0:
        return None
    gpu_mib = first.get("MemoryInfo", {}).get("SizeInMiB")
    return Shape(
        name=item["InstanceType"],
        vcpus=vcpus,
        memory_gb=round(memory_mib / 1024, 2),
        cpu_arch=arch,
        gpu_name=str(first.get("Name")) if first.get("Name") else None,
        gpu_maker=first.get("Manufacturer"),
        gpu_count=count,
        gpu_memory_gb=round(float(gpu_mib) / 1024, 2) if gpu_mib else None,
        gpu_slice=part,
    )


def fetch_shapes(ec2: Any) -> list[Shape]:
    """Every instance type of the client's region that gpulayer can use."""
    shapes = []
    for page in ec2.get_paginator("describe_instance_types").paginate():
        for item in page.get("InstanceTypes", []):
            shape = shape_from_api(item)
            if shape is not None:
                shapes.append(shape)
    return shapes


def fetch_zones(ec2: Any, instance_types: list[str]) -> dict[str, list[str]]:
    """Instance type -> availability zones of the client's region that offer it."""
    zones: dict[str, set[str]] = {}
    paginator = ec2.get_paginator("describe_instance_type_offerings")
    # Filters take a bounded number of values; ask in chunks.
    for start in range(0, len(instance_types), 100):
        chunk = instance_types[start : start + 100]
        pages = paginator.paginate(
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": chunk}],
        )
        for page in pages:
            for item in page.get("InstanceTypeOfferings", []):
                zones.setdefault(item["InstanceType"], set()).add(item["Location"])
    return {name: sorted(found) for name, found in zones.items()}
