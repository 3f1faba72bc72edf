"""Reading what a machine's own tools print: /proc/meminfo, ``uname -m`` and nvidia-smi's
query output. Pure, so the worker's probe of its own machine and a provider that probes a
host over SSH read the same text the same way, and a host's offer says what its worker will
report once bootstrapped.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gpulayer.hardware.gpus import cuda_capability, uses_host_memory
from gpulayer.spec.capabilities import GpuDevice
from gpulayer.spec.models import CPU_ARCH_ALIASES

_GIB = 1024**3
_MIB_PER_GIB = 1024


def parse_meminfo(text: str) -> float | None:
    """GiB of MemTotal from /proc/meminfo text."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "MemTotal":
            parts = value.split()
            if parts and parts[0].isdigit():
                kib = int(parts[0])
                return round(kib * 1024 / _GIB, 2)
    return None


def normalize_cpu_arch(machine: str) -> str:
    """``uname -m``'s word in the spelling jobs use (amd64 -> x86_64, arm64 -> aarch64)."""
    raw = machine.lower()
    return CPU_ARCH_ALIASES.get(raw, raw)


# --- NVIDIA -----------------------------------------------------------------------------------

NVIDIA_FIELDS: tuple[str, ...] = (
    "index",
    "name",
    "memory.total",
    "compute_cap",
    "uuid",
    "driver_version",
)
# Drivers before R510 do not know compute_cap; they are asked for the rest.
NVIDIA_FIELDS_LEGACY: tuple[str, ...] = tuple(f for f in NVIDIA_FIELDS if f != "compute_cap")

_NOT_A_VALUE = re.compile(r"^\[.*\]$|^N/A$", re.IGNORECASE)  # [N/A], [Not Supported]
_CUDA_VERSION_RE = re.compile(r"CUDA Version\s*:\s*(\d+\.\d+)")


def nvidia_query_argv(fields: Sequence[str]) -> list[str]:
    return [
        "nvidia-smi",
        f"--query-gpu={','.join(fields)}",
        "--format=csv,noheader,nounits",
    ]


def compute_capability_for_name(name: str) -> str | None:
    """For drivers that cannot report it: the GPU facts table's, by product name (A10 is not
    an A100, L4 not an L40S); None for a name the table does not know, which a job with
    min_cuda_compute_capability treats as "not known to be enough"."""
    return cuda_capability(name)


def has_unified_memory(name: str) -> bool:
    """Integrated parts whose GPU shares the host's memory (DGX Spark's GB10): nvidia-smi
    reports their memory as not supported, so the host's RAM is what the GPU can use."""
    return uses_host_memory(name)


def tool_value(text: str) -> str | None:
    """A cell as a vendor tool printed it; None for empty, N/A and [Not Supported]."""
    text = text.strip()
    if not text or _NOT_A_VALUE.match(text):
        return None
    return text


def _gib_from_mib(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return round(float(text) / _MIB_PER_GIB, 2)
    except ValueError:
        return None


def _capability(text: str | None) -> str | None:
    if text is not None and re.fullmatch(r"\d{1,2}\.\d{1,2}", text):
        return text
    return None


def parse_nvidia_query(
    text: str,
    fields: Sequence[str] = NVIDIA_FIELDS,
    host_memory_gb: float | None = None,
) -> tuple[list[GpuDevice], str | None]:
    """Devices and driver version from ``--format=csv,noheader,nounits`` output.

    Lines that are not device rows (warnings, "Unable to determine the device handle" for a GPU
    that fell off the bus) are skipped: the devices that do answer are still usable.
    """
    gpus: list[GpuDevice] = []
    driver: str | None = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            continue
        row = dict(zip(fields, cells, strict=True))
        index = tool_value(row["index"])
        name = tool_value(row["name"])
        if index is None or not index.isdigit() or name is None:
            continue
        unified = has_unified_memory(name)
        memory_gb = _gib_from_mib(tool_value(row["memory.total"]))
        if unified and memory_gb is None:
            memory_gb = host_memory_gb
        capability = _capability(tool_value(row.get("compute_cap", "")))
        gpus.append(
            GpuDevice(
                index=int(index),
                name=name,
                memory_gb=memory_gb,
                memory_kind="unified" if unified else "dedicated",
                compute_capability=capability or compute_capability_for_name(name),
                uuid=tool_value(row.get("uuid", "")),
            )
        )
        driver = driver or tool_value(row.get("driver_version", ""))
    gpus.sort(key=lambda g: g.index)
    return gpus, driver


def parse_cuda_version(text: str) -> str | None:
    """The CUDA version the driver supports, from the banner of plain ``nvidia-smi``."""
    match = _CUDA_VERSION_RE.search(text)
    return match.group(1) if match else None
