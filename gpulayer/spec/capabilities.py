"""What a worker reports about itself. Placement matches jobs against this, never against
what a profile promises."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpulayer.spec.models import (
    MAX_CPU_CORES,
    MAX_DISK_GB,
    MAX_GPU_MEMORY_GB,
    MAX_GPUS_PER_NODE,
    MAX_HOURLY_COST,
    MAX_MEMORY_GB,
    Accelerator,
)


class ReportModel(BaseModel):
    # Newer workers may report more than this version knows; keep what we understand.
    model_config = ConfigDict(extra="ignore")


class GpuDevice(ReportModel):
    index: int
    name: str
    memory_gb: float | None = None
    memory_kind: Literal["dedicated", "unified"] | None = None
    compute_capability: str | None = None
    """CUDA compute capability "major.minor"; None for non-CUDA devices."""
    uuid: str | None = None


class WorkerCapabilities(ReportModel):
    accelerator: Accelerator = "cpu"
    gpus: list[GpuDevice] = Field(default_factory=list)
    cpu_cores: int = 1
    memory_gb: float | None = None
    disk_gb: float | None = None
    os: str = "linux"
    cpu_arch: str = "x86_64"
    python_version: str = "3.11.0"
    frameworks: dict[str, str] = Field(default_factory=dict)
    """Installed distributions the worker knows of, name -> version."""
    markers: list[str] = Field(default_factory=list)
    """Capabilities that hold, such as torch.cuda (a CUDA build of torch and a CUDA device)."""
    hostname: str = ""
    address: str = ""
    """Where the other nodes of a multi-node job reach this worker ("" : its hostname)."""
    driver_version: str | None = None
    cuda_version: str | None = None
    provider: str | None = None
    region: str | None = None
    zone: str | None = None
    hourly_price: float | None = None
    currency: str = "USD"
    isolation: Literal["uid_per_attempt", "shared_uid", "none"] | None = None
    """How the worker keeps its jobs from each other and from itself: a uid per attempt
    (--run-as-range), one unprivileged uid for all (--run-as), or none (its jobs run as its own
    user and can read its credential). None: not said (the local control plane's worker)."""

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)


# What a registering worker may say, bounded as a job's figures are: placement compares the two,
# and a figure no job could ask for (or NaN, which compares with nothing) is the report's
# mistake. Rows stored before these bounds are still read with the looser models above.
_Size = Field(ge=0, allow_inf_nan=False)


class BoundedGpuDevice(GpuDevice):
    index: Annotated[int, Field(ge=0, lt=MAX_GPUS_PER_NODE)]
    memory_gb: Annotated[float, _Size, Field(le=MAX_GPU_MEMORY_GB)] | None = None


class BoundedCapabilities(WorkerCapabilities):
    gpus: list[BoundedGpuDevice] = Field(  # type: ignore[assignment]
        default_factory=list, max_length=MAX_GPUS_PER_NODE
    )
    cpu_cores: Annotated[int, Field(ge=1, le=MAX_CPU_CORES)] = 1
    memory_gb: Annotated[float, _Size, Field(le=MAX_MEMORY_GB)] | None = None
    disk_gb: Annotated[float, _Size, Field(le=MAX_DISK_GB)] | None = None
    hourly_price: Annotated[float, _Size, Field(le=MAX_HOURLY_COST)] | None = None
