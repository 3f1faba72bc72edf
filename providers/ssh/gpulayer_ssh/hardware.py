"""What a host has, asked over SSH in one command and read by pure parsers.

The command prints sections (cores, /proc/meminfo, machine, system, free disk below the
install root, the nvidia-smi query); the parsers are the ones the worker's own probe uses, so
a host's offer says what its worker will report once bootstrapped.
"""

from __future__ import annotations

import shlex

from gpulayer.cloud import (
    NVIDIA_FIELDS,
    NVIDIA_FIELDS_LEGACY,
    Offer,
    normalize_cpu_arch,
    nvidia_query_argv,
    parse_meminfo,
    parse_nvidia_query,
)
from gpulayer_ssh.errors import PROVIDER
from gpulayer_ssh.settings import HostHardware, SshHost

_MARK = "@@gpulayer-"
_KIB_PER_GIB = 1024 * 1024


def probe_command(install_root: str) -> str:
    """One POSIX sh command printing every section; a missing tool leaves its section empty."""
    full = shlex.join(nvidia_query_argv(NVIDIA_FIELDS))
    legacy = shlex.join(nvidia_query_argv(NVIDIA_FIELDS_LEGACY))
    root = shlex.quote(install_root)
    return "; ".join(
        [
            f"echo {_MARK}nproc",
            "(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null)",
            f"echo {_MARK}meminfo",
            "cat /proc/meminfo 2>/dev/null",
            f"echo {_MARK}machine",
            "uname -m",
            f"echo {_MARK}system",
            "uname -s",
            f"echo {_MARK}disk",
            # Free space where job directories will be, or on the nearest existing parent.
            f'd={root}; while [ ! -d "$d" ]; do d=$(dirname "$d"); done; df -Pk "$d" 2>/dev/null',
            f"echo {_MARK}nvidia",
            "if command -v nvidia-smi >/dev/null 2>&1; then "
            f"out=$({full} 2>&1); "
            f'case $out in *"not a valid field"*) echo {_MARK}nvidia-legacy; {legacy} 2>&1;; '
            '*) printf "%s\\n" "$out";; esac; fi',
            f"echo {_MARK}end",
        ]
    )


def split_sections(text: str) -> dict[str, str]:
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith(_MARK):
            current = sections.setdefault(line[len(_MARK) :].strip(), [])
            continue
        if current is not None:
            current.append(line)
    return {name: "\n".join(lines) for name, lines in sections.items()}


def _free_disk_gb(df_output: str) -> float | None:
    # POSIX df -P: a header, then "filesystem blocks used available capacity mountpoint".
    rows = [line.split() for line in df_output.splitlines()[1:] if line.strip()]
    if not rows or len(rows[-1]) < 4 or not rows[-1][3].isdigit():
        return None
    return round(int(rows[-1][3]) / _KIB_PER_GIB, 2)


def parse_probe(text: str) -> HostHardware:
    """The hardware in the probe command's output. Pure."""
    sections = split_sections(text)
    if "end" not in sections:
        raise ValueError("the probe output is cut short")
    cores_text = sections.get("nproc", "").strip()
    if not cores_text.isdigit() or int(cores_text) < 1:
        raise ValueError(f"the host reports no CPU count ({cores_text!r})")
    memory_gb = parse_meminfo(sections.get("meminfo", ""))
    fields = NVIDIA_FIELDS_LEGACY if "nvidia-legacy" in sections else NVIDIA_FIELDS
    nvidia_text = sections.get("nvidia-legacy", sections.get("nvidia", ""))
    gpus, _driver = parse_nvidia_query(nvidia_text, fields, memory_gb)
    hardware = HostHardware(
        cpu_cores=int(cores_text),
        memory_gb=memory_gb,
        disk_gb=_free_disk_gb(sections.get("disk", "")) or None,
        cpu_arch=normalize_cpu_arch(sections.get("machine", "").strip() or "x86_64"),
        os=sections.get("system", "").strip().lower() or "linux",
    )
    if not gpus:
        return hardware
    memories = [g.memory_gb for g in gpus if g.memory_gb]
    capabilities = [g.compute_capability for g in gpus if g.compute_capability]
    return hardware.model_copy(
        update={
            "accelerator": "cuda",
            "gpu_name": gpus[0].name,
            "gpu_count": len(gpus),
            "gpu_memory_gb": min(memories) if memories else None,
            "gpu_memory_kind": gpus[0].memory_kind,
            # A job needing capability X needs it on every device it is given.
            "cuda_compute_capability": min(
                capabilities, key=lambda c: tuple(int(p) for p in c.split("."))
            )
            if capabilities
            else None,
        }
    )


def offer_for(host: SshHost, hardware: HostHardware) -> Offer:
    """The offer of one host. Its zone is the host's name, so a failure on the host blocks
    that host only."""
    return Offer(
        provider=PROVIDER,
        instance_type=host.name,
        region=host.region,
        zone=host.name,
        accelerator=hardware.accelerator,
        gpu_name=hardware.gpu_name,
        gpu_count=hardware.gpu_count,
        gpu_memory_gb=hardware.gpu_memory_gb,
        gpu_memory_kind=hardware.gpu_memory_kind,
        cuda_compute_capability=hardware.cuda_compute_capability,
        cpu_cores=hardware.cpu_cores,
        memory_gb=hardware.memory_gb,
        disk_gb=hardware.disk_gb,
        cpu_arch=hardware.cpu_arch,
        os=hardware.os,
        hourly_price=host.hourly_price,
        currency=host.currency,
        spot=False,
    )
