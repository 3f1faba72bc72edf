"""What a worker reports about itself. Placement matches jobs against this, never against
what a profile promises."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpulayer.spec.models import Accelerator


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
