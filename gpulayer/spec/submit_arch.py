"""The submitting machine's CPU architecture, which a rented machine gets when a job's
`resources.cpu_arch` is unset: a job written on an x86_64 laptop installs x86_64 wheels, and
the cheapest CUDA offer is often an ARM machine (AWS g5g) where they do not exist.

The control plane records it on the job as a label of its own (clients cannot send
``gpulayer.*`` labels), so every later reading of the job's offers, the plan's, the launch's
and a restarted control plane's, reads the same."""

from __future__ import annotations

import platform
from typing import Any

from gpulayer.spec.models import CPU_ARCH_ALIASES, JobSpec

SUBMIT_ARCH_LABEL = "gpulayer.submit.cpu_arch"


def machine_arch(name: str | None = None) -> str | None:
    """``name`` (else this machine's) as the spec names architectures; None when unknown, and
    for this machine when it is not Linux: a Mac's wheels are no Linux machine's anyway."""
    if name is None:
        name = local_arch_name()
    return CPU_ARCH_ALIASES.get(name.lower()) if name.isascii() else None


def local_arch_name() -> str:
    """What a client says of its own machine: its architecture on Linux, else nothing."""
    return platform.machine() if platform.system() == "Linux" else ""


def with_submit_arch(spec_data: Any, arch: str | None) -> Any:
    """``spec_data`` with the submitting machine's architecture recorded, when the job names
    none; unchanged otherwise (and for data that is not a spec: validation refuses it)."""
    if arch is None or not isinstance(spec_data, dict) or not _may_rent(spec_data):
        return spec_data
    resources = spec_data.get("resources")
    if isinstance(resources, dict) and resources.get("cpu_arch"):
        return spec_data
    labels = spec_data.get("labels")
    if labels is not None and not isinstance(labels, dict):
        return spec_data
    return {**spec_data, "labels": {**(labels or {}), SUBMIT_ARCH_LABEL: arch}}


def _may_rent(spec_data: dict[str, Any]) -> bool:
    """Whether the job names the cloud target (its first or a fallback): only such jobs carry
    the label, so other jobs' labels stay their own."""
    placement = spec_data.get("placement")
    if not isinstance(placement, dict):
        return False
    chain = [placement.get("target"), *(placement.get("fallback_targets") or [])]
    return "cloud" in chain


def rented_arch(spec: JobSpec) -> tuple[str, ...]:
    """The architectures a rented machine for ``spec`` may have: its own, else the submitting
    machine's, else any (empty)."""
    if spec.resources.cpu_arch:
        return tuple(spec.resources.cpu_arch)
    recorded = machine_arch(spec.labels.get(SUBMIT_ARCH_LABEL, ""))
    return (recorded,) if recorded else ()
