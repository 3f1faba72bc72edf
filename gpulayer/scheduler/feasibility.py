"""Feasibility checks: can this worker run this job, and if not, why.

Each check is called as ``(job, worker) -> str | None``: None when the worker satisfies the
one field it looks at, else a short reason a person can act on. The checks form a chain
(:data:`CHECKS`, in the order reasons are reported) as in Nomad's feasibility checkers, so a
new one plugs in by building a chain with it.

Checks that look at capacity judge the worker's *free* capacity. The two modes differ only
in the worker they are shown: :func:`reasons_now` shows the snapshot as it is;
:func:`reasons_never` shows ``worker.idle()``, the same worker with nothing running and ready,
so it judges total capacity and ignores load and state.

Each check is written once, in two stages, so that :class:`~gpulayer.scheduler.index.
WorkerIndex` can judge the first stage once per class of identical workers (Nomad's computed
class) and keep only the second, cheap one per worker. A check's function answers a
:data:`Verdict` from what it reads of the worker's class: None (every worker of the class
satisfies it), a reason (none does), or a :class:`Condition` on free capacity or state, which
the caller then tests on the worker itself. Calling the check does both stages, so the plain
scan and the index decide with the same code. The scope says what the first stage may read:

- ``static``: only ``worker.capabilities``, but not its per-host fields (hostname, zone,
  hourly_price, currency: see ``index.PER_HOST_FIELDS``); its verdict is never a Condition;
- ``load``: the same capabilities; free capacity, state and running count only through the
  Condition it returns;
- ``identity``: anything else about the worker (id, name, labels, per-host fields), judged
  per worker and never cached.

Of the job, each check declares in ``reads`` the fields it reads (attribute paths such as
``resources.gpus``): equal values for every path mean equal verdicts, which is the key the
index caches class verdicts by (see :func:`key_reader`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from operator import attrgetter
from typing import Any, Literal

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
from gpulayer.spec.capabilities import GpuDevice, WorkerCapabilities
from gpulayer.spec.models import CPU_ARCH_ALIASES, JobSpec, ResourceRequest

Scope = Literal["static", "load", "identity"]


@dataclass(frozen=True, eq=False)
class Condition:
    """What a load check asks of one worker's free capacity or state.

    ``holds`` is the test; ``reason`` says why it fails, called only when it does. The bounds
    are promises the index prunes by: ``holds`` is False for a worker that is not ready when
    ``ready`` is set, with fewer than ``gpus`` free GPUs, or with fewer than ``cores`` free
    cores.
    """

    holds: Callable[[WorkerSnapshot], bool]
    reason: Callable[[WorkerSnapshot], str]
    ready: bool = False
    gpus: int = 0
    cores: float = 0.0


Verdict = None | str | Condition
CheckFunction = Callable[[JobSpec, WorkerSnapshot], Verdict]


@dataclass(frozen=True)
class Check:
    """A named feasibility check; calling it runs both stages on one worker."""

    name: str
    scope: Scope
    function: CheckFunction
    reads: tuple[str, ...] = ()

    def __call__(self, job: JobSpec, worker: WorkerSnapshot) -> str | None:
        return outcome(self.function(job, worker), worker)

    def verdict(self, job: JobSpec, worker: WorkerSnapshot) -> Verdict:
        """The first stage alone: for static and load checks, the answer for the worker's
        whole class."""
        return self.function(job, worker)


def outcome(verdict: Verdict, worker: WorkerSnapshot) -> str | None:
    """The second stage: a verdict's reason for this worker, None when it passes."""
    if verdict is None or isinstance(verdict, str):
        return verdict
    return None if verdict.holds(worker) else verdict.reason(worker)


def check(name: str, scope: Scope, reads: Sequence[str] = ()) -> Callable[[CheckFunction], Check]:
    def wrap(function: CheckFunction) -> Check:
        return Check(name, scope, function, tuple(reads))

    return wrap


_CONTAINERS = (list, tuple, dict)


def _freeze(value: Any) -> Hashable:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def key_reader(checks: Sequence[Check]) -> Callable[[JobSpec], Hashable]:
    """A function giving a job's values of every field these checks read: two jobs with equal
    keys get equal verdicts from each of them."""
    paths = tuple(sorted({path for chk in checks for path in chk.reads}))
    if not paths:
        return lambda job: ()
    getter = attrgetter(*paths)
    if len(paths) == 1:
        return lambda job: (_freeze(getter(job)),)

    def read(job: JobSpec) -> Hashable:
        # Asked once per placement decision: scalars pass through without a call.
        return tuple([_freeze(v) if type(v) in _CONTAINERS else v for v in getter(job)])

    return read


def _num(value: float) -> str:
    return f"{value:g}"


def _one_of(values: Sequence[str]) -> str:
    return " or ".join(values)


# --- state and identity ---------------------------------------------------------------------


def _is_ready(worker: WorkerSnapshot) -> bool:
    return worker.ready


_READY = Condition(_is_ready, lambda worker: f"worker is {worker.state}", ready=True)


@check("state", "load")
def state(job: JobSpec, worker: WorkerSnapshot) -> Verdict:
    return _READY


_IDS_SHOWN = 5


@check("worker_ids", "identity", reads=("placement.worker_ids",))
def worker_ids(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    pinned = job.placement.worker_ids
    if not pinned or worker.id in pinned:
        return None
    shown = ", ".join(pinned[:_IDS_SHOWN]) + (", ..." if len(pinned) > _IDS_SHOWN else "")
    return f"not one of the pinned worker_ids ({shown})"


@check("worker_labels", "identity", reads=("placement.worker_labels",))
def worker_labels(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    wrong = []
    for key, value in job.placement.worker_labels.items():
        has = worker.labels.get(key)
        if has != value:
            wrong.append(f"{key}={value} (has {'none' if has is None else f'{key}={has}'})")
    return f"needs label {', '.join(wrong)}" if wrong else None


@check("providers", "static", reads=("placement.providers",))
def providers(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    # Providers and regions restrict provider-backed workers only (the JobSpec says so): a
    # job limited to aws may still fall back to this machine or an on-prem pool.
    wanted = job.placement.providers
    has = worker.capabilities.provider
    if not wanted or has is None or has in wanted:
        return None
    return f"needs provider {_one_of(wanted)}, has {has or 'none'}"


@check("regions", "static", reads=("placement.regions",))
def regions(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    wanted = job.placement.regions
    has = worker.capabilities.region
    if not wanted or worker.capabilities.provider is None or has in wanted:
        return None
    return f"needs region {_one_of(wanted)}, has {has or 'none'}"


# --- accelerator and GPUs -------------------------------------------------------------------


@check("accelerator", "static", reads=("resources.accelerator",))
def accelerator(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    wanted = job.resources.accelerator
    if wanted == "rocm":
        return "rocm jobs are not scheduled yet"
    if wanted == "cpu" or worker.capabilities.accelerator == wanted:
        return None
    return f"needs a {wanted} accelerator, has {worker.capabilities.accelerator}"


_GPU_JOB = ("resources.accelerator", "resources.gpu_count")


def _gpu_job(r: ResourceRequest, caps: WorkerCapabilities) -> bool:
    """GPU checks speak only when the accelerator matches; otherwise that check explains."""
    return r.gpus > 0 and r.accelerator == caps.accelerator != "rocm"


def _needs(r: ResourceRequest, qualifier: str = "") -> str:
    plural = "s" if r.gpus > 1 else ""
    return f"needs {r.gpus} {r.accelerator} GPU{plural}{qualifier}"


def _has(caps: WorkerCapabilities, free: list[GpuDevice], **show: bool) -> str:
    total = len(caps.gpus)
    described = describe_devices(free, **show)
    if len(free) == total:
        return f"has {described}"
    return f"has {described} free of {total}"


Meets = Callable[[ResourceRequest, GpuDevice], bool]


def _meeting(r: ResourceRequest, caps: WorkerCapabilities, meets: Meets) -> frozenset[int]:
    return frozenset(gpu.index for gpu in caps.gpus if meets(r, gpu))


def count_free_in(worker: WorkerSnapshot, devices: frozenset[int]) -> int:
    """How many of the worker's free GPUs are among these device indices."""
    return sum(1 for index in worker.free_gpus if index in devices)


def _device_field(
    job: JobSpec,
    worker: WorkerSnapshot,
    meets: Meets,
    qualifier: str,
    **show: bool,
) -> Verdict:
    """Enough free devices must meet one per-device field; when too few GPUs are free at all,
    gpu_count explains instead."""
    r = job.resources
    caps = worker.capabilities
    if not _gpu_job(r, caps):
        return None
    meeting = _meeting(r, caps, meets)
    if len(meeting) == len(caps.gpus):
        return None
    need = r.gpus

    def holds(w: WorkerSnapshot) -> bool:
        return len(w.free_gpus) < need or count_free_in(w, meeting) >= need

    def reason(w: WorkerSnapshot) -> str:
        return f"{_needs(r, qualifier)}, {_has(caps, free_devices(w), **show)}"

    return Condition(holds, reason)


@check("gpu_count", "load", reads=_GPU_JOB)
def gpu_count(job: JobSpec, worker: WorkerSnapshot) -> Verdict:
    r = job.resources
    caps = worker.capabilities
    if not _gpu_job(r, caps):
        return None
    need = r.gpus
    total = len(caps.gpus)

    def holds(w: WorkerSnapshot) -> bool:
        return len(w.free_gpus) >= need

    def reason(w: WorkerSnapshot) -> str:
        if len(w.free_gpus) == total:
            return f"{_needs(r)}, has {describe_devices(free_devices(w))}"
        return f"{_needs(r)}, {len(w.free_gpus)} of {total} free"

    return Condition(holds, reason, gpus=need)


@check("gpu_models", "load", reads=(*_GPU_JOB, "resources.gpu_models"))
def gpu_models(job: JobSpec, worker: WorkerSnapshot) -> Verdict:
    models = job.resources.gpu_models
    if not models:
        return None
    return _device_field(job, worker, meets_model, f" of model {_one_of(models)}")


@check("gpu_memory_gb", "load", reads=(*_GPU_JOB, "resources.gpu_memory_gb"))
def gpu_memory_gb(job: JobSpec, worker: WorkerSnapshot) -> Verdict:
    need = job.resources.gpu_memory_gb
    if need is None:
        return None
    return _device_field(job, worker, meets_memory, f" with >= {_num(need)} GB")


@check("gpu_memory_kind", "load", reads=(*_GPU_JOB, "resources.gpu_memory_kind"))
def gpu_memory_kind(job: JobSpec, worker: WorkerSnapshot) -> Verdict:
    kind = job.resources.gpu_memory_kind
    if kind is None:
        return None
    return _device_field(job, worker, meets_kind, f" with {kind} memory", kind=True)


@check(
    "min_cuda_compute_capability",
    "load",
    reads=(*_GPU_JOB, "resources.min_cuda_compute_capability"),
)
def min_cuda_compute_capability(job: JobSpec, worker: WorkerSnapshot) -> Verdict:
    need = job.resources.min_cuda_compute_capability
    if need is None:
        return None
    return _device_field(
        job, worker, meets_capability, f" with compute capability >= {need}", capability=True
    )


_PER_DEVICE = (meets_model, meets_memory, meets_kind, meets_capability)


@check(
    "gpu_devices",
    "load",
    reads=(
        *_GPU_JOB,
        "resources.gpu_models",
        "resources.gpu_memory_gb",
        "resources.gpu_memory_kind",
        "resources.min_cuda_compute_capability",
    ),
)
def gpu_devices(job: JobSpec, worker: WorkerSnapshot) -> Verdict:
    """Devices may each meet one field but too few meet all of them together."""
    r = job.resources
    caps = worker.capabilities
    if not _gpu_job(r, caps):
        return None
    every = _meeting(r, caps, device_meets)
    total = len(caps.gpus)
    if len(every) == total:
        return None
    need = r.gpus
    # A field every device meets never explains; the others do when too few free meet them.
    fields = [m for meets in _PER_DEVICE if len(m := _meeting(r, caps, meets)) < total]

    def holds(w: WorkerSnapshot) -> bool:
        if len(w.free_gpus) < need:
            return True  # gpu_count explains
        if any(count_free_in(w, meeting) < need for meeting in fields):
            return True  # that field's own check explains
        return count_free_in(w, every) >= need

    def reason(w: WorkerSnapshot) -> str:
        parts = []
        if r.gpu_models:
            parts.append(f"model {_one_of(r.gpu_models)}")
        if r.gpu_memory_gb is not None:
            parts.append(f">= {_num(r.gpu_memory_gb)} GB")
        if r.gpu_memory_kind is not None:
            parts.append(f"{r.gpu_memory_kind} memory")
        if r.min_cuda_compute_capability is not None:
            parts.append(f"compute capability >= {r.min_cuda_compute_capability}")
        has = _has(caps, free_devices(w), kind=True, capability=True)
        return f"{_needs(r, ' each with ' + ', '.join(parts))}, {has}"

    return Condition(holds, reason)


# --- host -----------------------------------------------------------------------------------


@check("cpu_cores", "load", reads=("resources.cpu_cores",))
def cpu_cores(job: JobSpec, worker: WorkerSnapshot) -> Verdict:
    need = job.resources.cpu_cores
    total = worker.capabilities.cpu_cores

    def holds(w: WorkerSnapshot) -> bool:
        return w.free_cpu_cores >= need

    def reason(w: WorkerSnapshot) -> str:
        free = w.free_cpu_cores
        plural = "" if need == 1 else "s"
        if free >= total:
            return f"needs {_num(need)} CPU core{plural}, has {total}"
        return f"needs {_num(need)} CPU core{plural}, {_num(max(free, 0))} of {total} free"

    return Condition(holds, reason, cores=float(need))


@check("memory_gb", "load", reads=("resources.memory_gb",))
def memory_gb(job: JobSpec, worker: WorkerSnapshot) -> Verdict:
    need = job.resources.memory_gb
    if need is None:
        return None
    total = worker.capabilities.memory_gb

    def holds(w: WorkerSnapshot) -> bool:
        free = w.host_memory_free
        return free is not None and free >= need

    def reason(w: WorkerSnapshot) -> str:
        free = w.host_memory_free
        if free is None:
            return f"needs {_num(need)} GB memory, reports no memory size"
        if total is None or free >= total:
            return f"needs {_num(need)} GB memory, has {_num(free)} GB"
        return f"needs {_num(need)} GB memory, {_num(max(free, 0))} of {_num(total)} GB free"

    return Condition(holds, reason)


@check("disk_gb", "static", reads=("resources.disk_gb",))
def disk_gb(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    need = job.resources.disk_gb
    has = worker.capabilities.disk_gb
    if need is None or (has is not None and has >= need):
        return None
    if has is None:
        return f"needs {_num(need)} GB disk, reports no disk size"
    return f"needs {_num(need)} GB disk, has {_num(has)} GB"


@check("os", "static", reads=("resources.os",))
def operating_system(job: JobSpec, worker: WorkerSnapshot) -> str | None:
    wanted = job.resources.os
    has = worker.capabilities.os.lower()
    if not wanted or has in wanted:
        return None
    return f"needs os {_one_of(wanted)}, has {has}"


@check("cpu_arch", "static", reads=("resources.cpu_arch",))
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


@check("frameworks", "static", reads=("resources.frameworks",))
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


@check("python", "static", reads=("resources.python",))
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
