"""Feasibility checks: can this worker run this job, and if not, why.

Each check is a function ``(job, worker) -> str | None``: None when the worker satisfies the
one field it looks at, else a short reason a person can act on. The checks form a chain
(:data:`CHECKS`, in the order reasons are reported) as in Nomad's feasibility checkers, so a
new one plugs in by building a chain with it.

Checks that look at capacity judge the worker's *free* capacity. The two modes differ only
in the worker they are shown: :func:`reasons_now` shows the snapshot as it is;
:func:`reasons_never` shows ``worker.idle()``, the same worker with nothing running and ready,
so it judges total capacity and ignores load and state.

Each check declares a scope, which lets :class:`~gpulayer.scheduler.index.WorkerIndex` judge
most checks once per group of identical workers instead of once per worker:

- ``static``: reads only ``worker.capabilities``, but not its per-host fields (hostname,
  zone, hourly_price, currency: see ``index.PER_HOST_FIELDS``);
- ``load``: reads those capabilities plus free capacity, state or running count;
- ``identity``: reads anything else about the worker: id, name, labels, per-host fields.

Of the job, static and load checks read only ``job.resources`` and the placement's
``providers`` and ``regions`` (what :func:`~gpulayer.scheduler.index.job_shape` holds), since
the index caches their answers per shape; identity checks may read any of ``job.placement``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from gpulayer.scheduler.gpus import (
    describe_devices,
    device_meets,
    free_devices,
    meets_capability,
    meets_kind,
    meets_memory,
    meets_model,
)
from gpulayer.scheduler.snapshot import WorkerSnapshot
from gpulayer.spec.capabilities import GpuDevice
from gpulayer.spec.models import CPU_ARCH_ALIASES, JobSpec, ResourceRequest

Scope = Literal["static", "load", "identity"]
CheckFunction = Callable[[JobSpec, WorkerSnapshot], "str | None"]


@dataclass(frozen=True)
class Check:
    """A named feasibility check; calling it runs the function."""

    name: str
    scope: Scope
    function: CheckFunction

    def __call__(self, job: JobSpec, worker: WorkerSnapshot) -> str | None:
        return self.function(job, worker)


def check(name: str, scope: Scope) -> Callable[[CheckFunction], Check]:
    def wrap(function: CheckFunction) -> Check:
        return Check(name, scope, function)

    return wrap


def _num(value: float) -> str:
    return f"{value:g}"


def _one_of(values: Sequence[str]) -> str:
    return " or ".join(values)


# --- state and identity ---------------------------------------------------------------------


@check("state", "load")
def state(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    return None if worker.ready else f"worker is {worker.state}"


_IDS_SHOWN = 5


@check("worker_ids", "identity")
def worker_ids(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    pinned = job.placement.worker_ids
    if not pinned or worker.id in pinned:
        return None
    shown = ", ".join(pinned[:_IDS_SHOWN]) + (", ..." if len(pinned) > _IDS_SHOWN else "")
    return f"not one of the pinned worker_ids ({shown})"


@check("worker_labels", "identity")
def worker_labels(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    wrong = []
    for key, value in job.placement.worker_labels.items():
        has = worker.labels.get(key)
        if has != value:
            wrong.append(f"{key}={value} (has {'none' if has is None else f'{key}={has}'})")
    return f"needs label {', '.join(wrong)}" if wrong else None


@check("providers", "static")
def providers(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    # Providers and regions restrict provider-backed workers only (the JobSpec says so): a
    # job limited to aws may still fall back to this machine or an on-prem pool.
    wanted = job.placement.providers
    has = worker.capabilities.provider
    if not wanted or has is None or has in wanted:
        return None
    return f"needs provider {_one_of(wanted)}, has {has or 'none'}"


@check("regions", "static")
def regions(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    wanted = job.placement.regions
    has = worker.capabilities.region
    if not wanted or worker.capabilities.provider is None or has in wanted:
        return None
    return f"needs region {_one_of(wanted)}, has {has or 'none'}"


# --- accelerator and GPUs -------------------------------------------------------------------


@check("accelerator", "static")
def accelerator(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    wanted = job.resources.accelerator
    if wanted == "rocm":
        return "rocm jobs are not scheduled yet"
    if wanted == "cpu" or worker.capabilities.accelerator == wanted:
        return None
    return f"needs a {wanted} accelerator, has {worker.capabilities.accelerator}"


def _gpu_job(job: JobSpec, worker: WorkerSnapshot) -> bool:
    """GPU checks speak only when the accelerator matches; otherwise that check explains."""
    r = job.resources
    return r.gpus > 0 and r.accelerator == worker.capabilities.accelerator != "rocm"


def _needs(r: ResourceRequest, qualifier: str = "") -> str:
    plural = "s" if r.gpus > 1 else ""
    return f"needs {r.gpus} {r.accelerator} GPU{plural}{qualifier}"


def _has(worker: WorkerSnapshot, free: list[GpuDevice], **show: bool) -> str:
    total = len(worker.capabilities.gpus)
    described = describe_devices(free, **show)
    if len(free) == total:
        return f"has {described}"
    return f"has {described} free of {total}"


def _gpu_reason(
    job: JobSpec,
    worker: WorkerSnapshot,
    meets: Callable[[ResourceRequest, GpuDevice], bool],
    qualifier: str,
    **show: bool,
) -> str | None:
    r = job.resources
    if not _gpu_job(job, worker):
        return None
    free = free_devices(worker)
    if len(free) < r.gpus:
        return None  # gpu_count explains
    if sum(1 for gpu in free if meets(r, gpu)) >= r.gpus:
        return None
    return f"{_needs(r, qualifier)}, {_has(worker, free, **show)}"


@check("gpu_count", "load")
def gpu_count(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    r = job.resources
    if not _gpu_job(job, worker):
        return None
    free = free_devices(worker)
    if len(free) >= r.gpus:
        return None
    total = len(worker.capabilities.gpus)
    if len(free) == total:
        return f"{_needs(r)}, has {describe_devices(free)}"
    return f"{_needs(r)}, {len(free)} of {total} free"


@check("gpu_models", "load")
def gpu_models(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    models = job.resources.gpu_models
    if not models:
        return None
    return _gpu_reason(job, worker, meets_model, f" of model {_one_of(models)}")


@check("gpu_memory_gb", "load")
def gpu_memory_gb(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    need = job.resources.gpu_memory_gb
    if need is None:
        return None
    return _gpu_reason(job, worker, meets_memory, f" with >= {_num(need)} GB")


@check("gpu_memory_kind", "load")
def gpu_memory_kind(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    kind = job.resources.gpu_memory_kind
    if kind is None:
        return None
    return _gpu_reason(job, worker, meets_kind, f" with {kind} memory", kind=True)


@check("min_cuda_compute_capability", "load")
def min_cuda_compute_capability(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    need = job.resources.min_cuda_compute_capability
    if need is None:
        return None
    return _gpu_reason(
        job, worker, meets_capability, f" with compute capability >= {need}", capability=True
    )


@check("gpu_devices", "load")
def gpu_devices(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    """Devices may each meet one field but too few meet all of them together."""
    r = job.resources
    if not _gpu_job(job, worker):
        return None
    free = free_devices(worker)
    if len(free) < r.gpus:
        return None
    for meets in (meets_model, meets_memory, meets_kind, meets_capability):
        if sum(1 for gpu in free if meets(r, gpu)) < r.gpus:
            return None  # that field's own check explains
    if sum(1 for gpu in free if device_meets(r, gpu)) >= r.gpus:
        return None
    parts = []
    if r.gpu_models:
        parts.append(f"model {_one_of(r.gpu_models)}")
    if r.gpu_memory_gb is not None:
        parts.append(f">= {_num(r.gpu_memory_gb)} GB")
    if r.gpu_memory_kind is not None:
        parts.append(f"{r.gpu_memory_kind} memory")
    if r.min_cuda_compute_capability is not None:
        parts.append(f"compute capability >= {r.min_cuda_compute_capability}")
    has = _has(worker, free, kind=True, capability=True)
    return f"{_needs(r, ' each with ' + ', '.join(parts))}, {has}"


# --- host -----------------------------------------------------------------------------------


@check("cpu_cores", "load")
def cpu_cores(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    need = job.resources.cpu_cores
    free = worker.free_cpu_cores
    if free >= need:
        return None
    total = worker.capabilities.cpu_cores
    plural = "" if need == 1 else "s"
    if free >= total:
        return f"needs {_num(need)} CPU core{plural}, has {total}"
    return f"needs {_num(need)} CPU core{plural}, {_num(max(free, 0))} of {total} free"


@check("memory_gb", "load")
def memory_gb(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    need = job.resources.memory_gb
    if need is None:
        return None
    free = worker.host_memory_free
    if free is None:
        return f"needs {_num(need)} GB memory, reports no memory size"
    if free >= need:
        return None
    total = worker.capabilities.memory_gb
    if total is None or free >= total:
        return f"needs {_num(need)} GB memory, has {_num(free)} GB"
    return f"needs {_num(need)} GB memory, {_num(max(free, 0))} of {_num(total)} GB free"


@check("disk_gb", "static")
def disk_gb(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    need = job.resources.disk_gb
    has = worker.capabilities.disk_gb
    if need is None or (has is not None and has >= need):
        return None
    if has is None:
        return f"needs {_num(need)} GB disk, reports no disk size"
    return f"needs {_num(need)} GB disk, has {_num(has)} GB"


@check("os", "static")
def operating_system(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    wanted = job.resources.os
    has = worker.capabilities.os.lower()
    if not wanted or has in wanted:
        return None
    return f"needs os {_one_of(wanted)}, has {has}"


@check("cpu_arch", "static")
def cpu_arch(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    wanted = job.resources.cpu_arch
    reported = worker.capabilities.cpu_arch.lower()
    has = CPU_ARCH_ALIASES.get(reported, reported)
    if not wanted or has in wanted:
        return None
    return f"needs cpu_arch {_one_of(wanted)}, has {has}"


# --- software -------------------------------------------------------------------------------


@lru_cache(maxsize=1024)
def _specifier(text: str) -> SpecifierSet | None:
    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        return None


@lru_cache(maxsize=4096)
def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _version_reason(what: str, spec: str, has: str) -> str | None:
    """None when version ``has`` satisfies ``spec``; an installed pre-release counts."""
    specifier = _specifier(spec)
    version = _version(has)
    if specifier is None:
        return f"needs {what}{spec}, which is not a PEP 440 specifier"
    if version is None:
        return f"needs {what}{spec}, reports version {has!r}, which is not PEP 440"
    if specifier.contains(version, prereleases=True):
        return None
    return f"needs {what}{spec}, has {has}"


@check("frameworks", "static")
def frameworks(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    """PEP 440 specifiers against installed versions, names compared PEP 503-normalized.

    A dotted key with an empty specifier (``torch.cuda``) is a marker the worker must report;
    a distribution whose name has a dot (``zope.interface``) installed under that name also
    satisfies it. An empty specifier otherwise means "installed, any version".
    """
    wanted = job.resources.frameworks
    if not wanted:
        return None
    caps = worker.capabilities
    installed = {canonicalize_name(name): version for name, version in caps.frameworks.items()}
    markers = {marker.lower() for marker in caps.markers}
    reasons = []
    for key, spec in wanted.items():
        name = canonicalize_name(key)
        if "." in key and not spec and key.lower() in markers:
            continue
        if name not in installed:
            missing = "not reported" if "." in key and not spec else "not installed"
            reasons.append(f"needs {key}{spec}, {missing}")
            continue
        if spec:
            reason = _version_reason(key, spec, installed[name])
            if reason:
                reasons.append(reason)
    return "; ".join(reasons) or None


@check("python", "static")
def python_version(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    spec = job.resources.python
    if spec is None:
        return None
    return _version_reason("python ", spec, worker.capabilities.python_version)


CHECKS: tuple[Check, ...] = (
    state,
    worker_ids,
    worker_labels,
    providers,
    regions,
    accelerator,
    gpu_count,
    gpu_models,
    gpu_memory_gb,
    gpu_memory_kind,
    min_cuda_compute_capability,
    gpu_devices,
    cpu_cores,
    memory_gb,
    disk_gb,
    operating_system,
    cpu_arch,
    frameworks,
    python_version,
)
"""The default chain, in the order reasons are reported."""


def reasons_now(
    job: JobSpec, worker: WorkerSnapshot, checks: Sequence[Check] = CHECKS
) -> list[str]:
    """Why the worker cannot take the job now; empty when it fits its free capacity and is ready."""
    return [reason for chk in checks if (reason := chk(job, worker)) is not None]


def reasons_never(
    job: JobSpec, worker: WorkerSnapshot, checks: Sequence[Check] = CHECKS
) -> list[str]:
    """Why the worker could never run the job, judged on total capacity; empty when it could."""
    return reasons_now(job, worker.idle(), checks)
