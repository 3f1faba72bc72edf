"""Facts about GPUs that clouds rent out, keyed by a normalized name.

Clouds report a GPU's name and memory but not its CUDA compute capability, which jobs select on
(``min_cuda_compute_capability``). Only CUDA devices are listed: offers of other accelerators
(AMD, Habana Gaudi, Inferentia, Trainium) are left out by the providers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal


@dataclass(frozen=True)
class GpuFacts:
    name: str
    compute_capability: str
    memory_gb: float
    """Memory per device as sold; a provider's own figure wins when it reports one."""
    memory_kind: Literal["dedicated", "unified"] = "dedicated"


_VENDOR_WORDS = re.compile(r"^(NVIDIA|TESLA|GEFORCE)+")
_SEPARATORS = re.compile(r"[\s_\-]+")


def normalize_gpu_name(name: str) -> str:
    """ "NVIDIA Tesla T4" -> "T4", "a100-80gb" -> "A10080GB", "L40s" -> "L40S"."""
    squashed = _SEPARATORS.sub("", name.upper())
    return _VENDOR_WORDS.sub("", squashed) or squashed


def _facts(*rows: tuple[str, str, float]) -> Mapping[str, GpuFacts]:
    table = {normalize_gpu_name(name): GpuFacts(name, cc, memory) for name, cc, memory in rows}
    return MappingProxyType(table)


GPU_FACTS: Mapping[str, GpuFacts] = _facts(
    ("K80", "3.7", 12),
    ("M60", "5.2", 8),
    ("P4", "6.1", 8),
    ("P100", "6.0", 16),
    ("V100", "7.0", 16),
    ("V100-32GB", "7.0", 32),
    ("T4", "7.5", 16),
    ("T4g", "7.5", 16),
    ("A10", "8.6", 24),
    ("A10G", "8.6", 24),
    ("A100", "8.0", 40),
    ("A100-80GB", "8.0", 80),
    ("L4", "8.9", 24),
    ("L40", "8.9", 48),
    ("L40S", "8.9", 48),
    ("H100", "9.0", 80),
    ("H200", "9.0", 141),
    ("B200", "10.0", 180),
    ("RTX PRO Server 6000", "12.0", 96),
)


def gpu_facts(name: str | None) -> GpuFacts | None:
    if not name:
        return None
    return GPU_FACTS.get(normalize_gpu_name(name))


def cuda_capability(name: str | None) -> str | None:
    facts = gpu_facts(name)
    return facts.compute_capability if facts else None
