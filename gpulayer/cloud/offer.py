"""What a provider offers (``Offer``) and what a job needs from an offer (``OfferQuery``). Pure."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpulayer.spec.currency import CurrencyCode
from gpulayer.spec.models import CAPABILITY, CPU_ARCH_ALIASES, OS_NAMES, Accelerator
from gpulayer.spec.submit_arch import rented_arch

if TYPE_CHECKING:
    from gpulayer.spec.models import JobSpec


MemoryKind = Literal["dedicated", "unified"]


def parse_capability(value: str) -> tuple[int, int]:
    """ "8.6" -> (8, 6), so that "10.0" sorts above "9.0"."""
    major, minor = value.split(".")
    return int(major), int(minor)


def _check_capability(value: str | None) -> str | None:
    # The JobSpec's exact pattern: ASCII digits, the whole value.
    return value if value is None else CAPABILITY.check(value)


def check_arch(value: str) -> str:
    arch = CPU_ARCH_ALIASES.get(value.lower())
    if arch is None:
        known = ", ".join(sorted(CPU_ARCH_ALIASES))
        raise ValueError(f"unknown cpu_arch {value!r}; known: {known}")
    return arch


def check_os(value: str) -> str:
    if value.lower() not in OS_NAMES:
        raise ValueError(f"unknown os {value!r}; known: {', '.join(sorted(OS_NAMES))}")
    return value.lower()


class Hardware(BaseModel):
    """What a machine has, as jobs ask for it: an offer's hardware, or a host's described by
    hand. One set of fields and checks, so what a provider says of a machine reads the same
    everywhere."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True
    )
    _noun: ClassVar[str] = "machine"
    """Names the machine in errors: "a cpu offer has no GPUs"."""

    accelerator: Accelerator = "cpu"
    """cpu, cuda, mps or rocm."""
    gpu_name: str | None = None
    """The GPU model as the driver names it, e.g. NVIDIA A100-SXM4-80GB."""
    gpu_count: Annotated[int, Field(ge=0)] = 0
    """GPUs on the machine; at least 1 unless the accelerator is cpu."""
    gpu_memory_gb: Annotated[float, Field(gt=0)] | None = None
    """Memory per GPU in GB."""
    gpu_slice: Annotated[float, Field(gt=0, lt=1)] | None = None
    """Each GPU is this part of one physical GPU, with that part's memory (AWS g6f: 0.125 of an
    L4); None: whole GPUs. Only jobs that accept slices (``resources.gpu_slices``) get one."""
    gpu_memory_kind: MemoryKind | None = None
    """dedicated (a discrete GPU) or unified (shared with the CPU)."""
    cuda_compute_capability: str | None = None
    """major.minor, e.g. 8.0, for cuda machines."""
    cpu_cores: Annotated[float, Field(gt=0)]
    """CPU cores jobs may use."""
    memory_gb: Annotated[float, Field(gt=0)] | None = None
    """RAM in GB; None: unknown (jobs asking for memory do not fit)."""
    disk_gb: Annotated[float, Field(gt=0)] | None = None
    """Free disk in GB; None: unknown, or for a cloud offer sized at launch (network block
    storage)."""
    cpu_arch: str = "x86_64"
    """x86_64 or aarch64 (amd64 and arm64 are read as those)."""
    os: str = "linux"
    """linux, darwin or windows."""

    @field_validator("cuda_compute_capability")
    @classmethod
    def _capability_form(cls, value: str | None) -> str | None:
        return _check_capability(value)

    @field_validator("cpu_arch")
    @classmethod
    def _known_arch(cls, value: str) -> str:
        return check_arch(value)

    @field_validator("os")
    @classmethod
    def _known_os(cls, value: str) -> str:
        return check_os(value)

    @model_validator(mode="after")
    def _gpu_consistency(self) -> Hardware:
        noun = self._noun
        if self.accelerator == "cpu" and self.gpu_count:
            raise ValueError(f"gpu_count: a cpu {noun} has no GPUs; set its accelerator")
        if self.accelerator != "cpu" and not self.gpu_count:
            raise ValueError(f"gpu_count: a {self.accelerator} {noun} needs at least 1 GPU")
        if self.gpu_slice is not None and not self.gpu_count:
            raise ValueError(f"gpu_slice: a {noun} without GPUs has no slice of one")
        return self


class _OfferPlace(BaseModel):
    # Offer's first fields, in a base of their own so that an offer's JSON still starts with
    # where it is (Offer lists this base last, and pydantic orders fields base-last-first).
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    provider: Annotated[str, Field(min_length=1)]
    instance_type: Annotated[str, Field(min_length=1)]
    region: Annotated[str, Field(min_length=1)]
    zone: str | None = None
    zones: tuple[str, ...] = ()
    """When ``zone`` is None: the zones of the region known to have it (a catalog's offer,
    made for the region as a whole); a launch asks the provider's API for a zone."""


class Offer(Hardware, _OfferPlace):
    """One way to rent hardware: an instance type in a zone, on-demand or spot, at a price."""

    _noun: ClassVar[str] = "offer"

    hourly_price: Annotated[float, Field(ge=0)] | None = None
    """None when the price is unknown; such offers never pass a cost cap."""
    currency: CurrencyCode = "USD"
    spot: bool = False
    price_as_of: str | None = None
    """The date of the price catalog the price comes from; None for a price read live."""
    idle_nodes: Annotated[int, Field(ge=0)] | None = None
    """Machines of this offer free this moment (a Slurm partition's idle nodes of the shape);
    None: the provider does not say (a cloud's capacity is known only by launching)."""
    time_limit_seconds: Annotated[int, Field(gt=0)] | None = None
    """Longest a machine of this offer may be held (a Slurm partition's MaxTime); None: no
    limit."""

    @property
    def capability(self) -> tuple[int, int] | None:
        cc = self.cuda_compute_capability
        return parse_capability(cc) if cc else None

    @property
    def rank_key(self) -> tuple[float, int, str, str, str, str, bool]:
        """The rank order: price (unknown last), then GPU count (fewer surplus GPUs), then
        names so that equal offers always come out in the same order, on-demand first."""
        price = self.hourly_price
        return (
            float("inf") if price is None else price,
            self.gpu_count,
            self.provider,
            self.region,
            self.zone or "",
            self.instance_type,
            self.spot,
        )

    @property
    def label(self) -> str:
        """Names the offer in logs and tables: aws/us-east-1a/g5.xlarge (spot)."""
        where = self.zone or self.region
        return f"{self.provider}/{where}/{self.instance_type}{' (spot)' if self.spot else ''}"


class OfferQuery(BaseModel):
    """What one node of a job needs, plus optional narrowing (GPU name, spot, where to look)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    accelerator: Accelerator = "cpu"
    gpu_count: Annotated[int, Field(ge=0)] = 0
    gpu_memory_gb: Annotated[float, Field(gt=0)] | None = None
    gpu_memory_kind: MemoryKind | None = None
    min_cuda_compute_capability: str | None = None
    cpu_cores: Annotated[float, Field(gt=0)] = 1
    memory_gb: Annotated[float, Field(gt=0)] | None = None
    disk_gb: Annotated[float, Field(gt=0)] | None = None
    os: tuple[str, ...] = ()
    cpu_arch: tuple[str, ...] = ()
    gpu_count_exact: bool = True
    """True: an offer needs exactly ``gpu_count`` GPUs (a rented machine's surplus GPUs are
    paid for and idle); False: at least that many (listing what there is)."""
    gpu_models: tuple[str, ...] = ()
    """Only offers of one of these GPU models, read by :func:`gpulayer.hardware.gpus.parse_gpu_name`
    ("a100" matches "A100"; "A100-80GB" also needs 80 GB); empty: any."""
    spot: bool | None = None
    """True: spot offers only; False: on-demand only; None: either."""
    gpu_slices: bool = False
    """True: a slice of one GPU (an offer's ``gpu_slice``) counts as a GPU; False: whole GPUs
    only."""
    regions: tuple[str, ...] = ()
    """Where a provider needs to look; empty means its configured regions."""

    @field_validator("min_cuda_compute_capability")
    @classmethod
    def _capability_form(cls, value: str | None) -> str | None:
        return _check_capability(value)

    @field_validator("cpu_arch")
    @classmethod
    def _known_arch(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(check_arch(v) for v in values))

    @field_validator("os")
    @classmethod
    def _known_os(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(check_os(v) for v in values))

    @model_validator(mode="before")
    @classmethod
    def _one_model_name(cls, data: Any) -> Any:
        # gpu_name: the single-model spelling of gpu_models, kept for callers that use it.
        if isinstance(data, dict) and "gpu_name" in data:
            data = dict(data)
            name = data.pop("gpu_name")
            if name:
                data["gpu_models"] = (*data.get("gpu_models", ()), name)
        return data

    @field_validator("gpu_models")
    @classmethod
    def _distinct_models(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n.strip() for n in names if n.strip()))

    @model_validator(mode="before")
    @classmethod
    def _default_gpu_count(cls, data: Any) -> Any:
        # As in a JobSpec: a GPU accelerator means one GPU unless told otherwise.
        if isinstance(data, dict) and data.get("gpu_count") is None:
            gpu = data.get("accelerator", "cpu") != "cpu"
            data = {**data, "gpu_count": 1 if gpu else 0}
        return data

    @model_validator(mode="after")
    def _gpu_rules(self) -> OfferQuery:
        if self.accelerator == "cpu" and self.gpu_count:
            raise ValueError("gpu_count: a cpu job cannot ask for GPUs; set an accelerator")
        if self.accelerator != "cpu" and not self.gpu_count:
            raise ValueError(f"gpu_count: accelerator {self.accelerator} needs at least 1 GPU")
        return self

    @classmethod
    def from_spec(
        cls,
        spec: JobSpec,
        *,
        gpu_name: str | None = None,
        spot: bool | None = None,
        gpu_count_exact: bool = True,
    ) -> OfferQuery:
        """The needs of one node of ``spec``; placement limits (providers, regions, cost cap)
        are applied by :func:`gpulayer.cloud.ranking.filter_offers`."""
        res = spec.resources
        models = (*res.gpu_models, *((gpu_name,) if gpu_name else ()))
        return cls(
            accelerator=res.accelerator,
            gpu_count=res.gpus,
            gpu_memory_gb=res.gpu_memory_gb,
            gpu_memory_kind=res.gpu_memory_kind,
            min_cuda_compute_capability=res.min_cuda_compute_capability,
            cpu_cores=res.cpu_cores,
            memory_gb=res.memory_gb,
            disk_gb=res.disk_gb,
            os=tuple(res.os),
            cpu_arch=rented_arch(spec),
            gpu_models=models,
            gpu_count_exact=gpu_count_exact,
            spot=spot,
            gpu_slices=res.gpu_slices,
            regions=tuple(spec.placement.regions),
        )
