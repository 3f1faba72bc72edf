"""What this machine can run: the capability report a worker registers with.

Read from the operating system, vendor tools (nvidia-smi, rocm-smi) and package metadata only;
no ML framework is imported, so probing takes milliseconds and never touches a GPU context.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from gpulayer.hardware.probe_parsing import normalize_cpu_arch, parse_meminfo
from gpulayer.spec.capabilities import WorkerCapabilities
from gpulayer.spec.models import Accelerator
from gpulayer.worker.probe_frameworks import (
    framework_key,
    framework_versions,
    installed_distributions,
    is_marker_key,
    markers_for,
)
from gpulayer.worker.probe_gpu import (
    CommandResult,
    GpuReport,
    Runner,
    probe_apple,
    probe_nvidia,
    probe_rocm,
    run_command,
)

__all__ = [
    "CACHE_SECONDS",
    "CommandResult",
    "Runner",
    "collect_capabilities",
    "cpu_arch",
    "cpu_cores",
    "default_data_dir",
    "disk_free_gb",
    "framework_key",
    "host_memory_gb",
    "is_marker_key",
    "os_name",
    "probe_capabilities",
    "run_command",
]

CACHE_SECONDS = 60.0
"""Hardware does not change under a running worker; packages rarely do. Callers that just
installed something pass refresh=True."""

_GIB = 1024**3


def cpu_cores() -> int:
    # The affinity mask is what this process may use (taskset, cpusets); cpu_count is the host.
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def host_memory_gb(system: str, runner: Runner = run_command) -> float | None:
    if system == "linux":
        try:
            return parse_meminfo(Path("/proc/meminfo").read_text())
        except OSError:
            pass
    if system == "darwin":
        result = runner(["sysctl", "-n", "hw.memsize"])
        text = result.stdout.strip()
        return round(int(text) / _GIB, 2) if result.ok and text.isdigit() else None
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / _GIB, 2)
    except (AttributeError, ValueError, OSError):
        return None  # Windows has no sysconf


def default_data_dir() -> Path:
    home = os.environ.get("GPULAYER_HOME")
    if home:
        return Path(home)
    import platformdirs  # only when no GPULAYER_HOME: a worker normally has one

    return Path(platformdirs.user_data_dir("gpulayer", appauthor=False))


def disk_free_gb(path: str | os.PathLike[str]) -> float | None:
    """Free GiB on the volume that holds ``path``, or would hold it once created."""
    candidate = Path(path).absolute()
    for directory in (candidate, *candidate.parents):
        if directory.exists():
            try:
                return round(shutil.disk_usage(directory).free / _GIB, 2)
            except OSError:
                return None
    return None


def os_name(system: str | None = None) -> str:
    return (system or platform.system()).lower()


def cpu_arch(machine: str | None = None) -> str:
    return normalize_cpu_arch(machine or platform.machine())


def _probe_gpus(
    system: str, arch: str, runner: Runner, memory_gb: float | None
) -> tuple[Accelerator, GpuReport]:
    if system == "darwin":
        if arch == "aarch64":
            return "mps", probe_apple(runner, memory_gb)
        return "cpu", GpuReport()
    nvidia = probe_nvidia(runner, memory_gb)
    if nvidia.gpus:
        return "cuda", nvidia
    if system == "linux":
        rocm = probe_rocm(runner)
        if rocm.gpus:
            return "rocm", rocm
    return "cpu", GpuReport()


def collect_capabilities(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    runner: Runner = run_command,
    system: str | None = None,
    machine: str | None = None,
    search_path: Sequence[str] | None = None,
) -> WorkerCapabilities:
    """Probe now, uncached. ``runner``, ``system``, ``machine`` and ``search_path`` stand in
    for the vendor tools, platform.system(), platform.machine() and sys.path."""
    os_ = os_name(system)
    arch = cpu_arch(machine)
    memory_gb = host_memory_gb(os_, runner)
    accelerator, gpus = _probe_gpus(os_, arch, runner, memory_gb)
    installed = installed_distributions(search_path)
    return WorkerCapabilities(
        accelerator=accelerator,
        gpus=gpus.gpus,
        cpu_cores=cpu_cores(),
        memory_gb=memory_gb,
        disk_gb=disk_free_gb(default_data_dir() if data_dir is None else data_dir),
        os=os_,
        cpu_arch=arch,
        python_version=platform.python_version(),
        frameworks=framework_versions(installed),
        markers=markers_for(installed, accelerator, len(gpus.gpus)),
        hostname=socket.gethostname(),
        driver_version=gpus.driver_version,
        cuda_version=gpus.cuda_version,
    )


_cache_lock = threading.Lock()
_cache: dict[str, tuple[float, WorkerCapabilities]] = {}


def probe_capabilities(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    refresh: bool = False,
) -> WorkerCapabilities:
    """This machine's capabilities, remembered for CACHE_SECONDS per data directory.

    Each call returns its own copy, so a caller that fills in provider or price does not
    change what the next caller sees.
    """
    directory = Path(default_data_dir() if data_dir is None else data_dir).absolute()
    key = str(directory)
    now = time.monotonic()
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None and not refresh and now - hit[0] < CACHE_SECONDS:
            return hit[1].model_copy(deep=True)
    capabilities = collect_capabilities(directory)
    with _cache_lock:
        _cache[key] = (time.monotonic(), capabilities)
    return capabilities.model_copy(deep=True)
