"""Facts about GPUs, keyed by model, and the one normalization of GPU names.

Everything that compares GPUs goes through here: offers of every provider, what workers
report, and what jobs ask for (``resources.gpu_models``, ``--gpu``). A name as a driver or a
cloud spells it ("NVIDIA A100-SXM4-80GB", "Tesla T4", "a10g") is read as a model ("A100")
and, when the name says it, a memory size (80 GB).

Memory is compared at its nominal size: drivers report less than the size a GPU is sold with
(an A10G or L4 shows 22.35 GiB of its 24 GB, an A100 79.2 of 80), so a job asking for 24 GB
fits an A10G. Clouds (and old drivers) report a GPU's name and memory but not its CUDA
compute capability, which jobs select on (``min_cuda_compute_capability``); the table gives it.
Only CUDA devices are listed: offers of other accelerators (AMD, Habana Gaudi, Inferentia,
Trainium) are left out by the providers.

Pure: no I/O, no pydantic, so the scheduler and the CLI import it cheaply.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Literal


@dataclass(frozen=True)
class GpuFacts:
    name: str
    compute_capability: str
    memory_sizes: tuple[float, ...]
    """Memory per device as sold, in GB, smallest first (A100: 40 and 80); empty for parts
    that use the host's memory."""
    memory_kind: Literal["dedicated", "unified"] = "dedicated"

    @property
    def memory_gb(self) -> float | None:
        """The smallest size: what a name without a size promises."""
        return self.memory_sizes[0] if self.memory_sizes else None


@dataclass(frozen=True)
class GpuName:
    """A GPU name read as a model and, when the name carries one, a memory size."""

    model: str
    """Normalized: upper case, no vendor words or separators ("A100", "L40S", "RTX4090")."""
    memory_gb: float | None = None

    def __str__(self) -> str:
        return self.model + (f"-{self.memory_gb:g}GB" if self.memory_gb is not None else "")


_VENDOR_WORDS = re.compile(r"^(NVIDIA|TESLA|GEFORCE)+")
_SEPARATORS = re.compile(r"[\s_\-]+")
# "80GB", "80 GB", "32G", "141GB": a memory size inside a name. Not "GB200" (letters first).
_MEMORY = re.compile(r"(?<![A-Z0-9])(\d{1,4})\s*G(?:I?B)?(?![A-Z0-9])", re.IGNORECASE)


def normalize_gpu_name(name: str) -> str:
    """ "NVIDIA Tesla T4" -> "T4", "a100-80gb" -> "A10080GB", "L40s" -> "L40S"."""
    squashed = _SEPARATORS.sub("", name.upper())
    return _VENDOR_WORDS.sub("", squashed) or squashed


def _facts(*rows: tuple[Any, ...]) -> Mapping[str, GpuFacts]:
    return MappingProxyType({normalize_gpu_name(row[0]): GpuFacts(*row) for row in rows})


GPU_FACTS: Mapping[str, GpuFacts] = _facts(
    # Data center parts, by generation.
    ("K80", "3.7", (12,)),
    ("M40", "5.2", (12, 24)),
    ("M60", "5.2", (8,)),
    ("P4", "6.1", (8,)),
    ("P40", "6.1", (24,)),
    ("P100", "6.0", (12, 16)),
    ("V100", "7.0", (16, 32)),
    ("T4", "7.5", (16,)),
    ("T4g", "7.5", (16,)),
    ("A2", "8.6", (16,)),
    ("A10", "8.6", (24,)),
    ("A10G", "8.6", (24,)),
    ("A16", "8.6", (16,)),
    ("A30", "8.0", (24,)),
    ("A40", "8.6", (48,)),
    ("A100", "8.0", (40, 80)),
    ("A800", "8.0", (40, 80)),
    ("L4", "8.9", (24,)),
    ("L20", "8.9", (48,)),
    ("L40", "8.9", (48,)),
    ("L40S", "8.9", (48,)),
    ("H20", "9.0", (96,)),
    ("H100", "9.0", (80, 94)),
    ("H800", "9.0", (80,)),
    ("H200", "9.0", (141,)),
    ("GH200", "9.0", (96, 144)),
    ("B100", "10.0", (192,)),
    ("B200", "10.0", (180,)),
    ("GB200", "10.0", (186,)),
    ("B300", "10.3", (288,)),
    ("GB300", "10.3", (288,)),
    ("GB10", "12.1", (), "unified"),  # DGX Spark: the GPU uses the host's memory
    ("RTX PRO Server 6000", "12.0", (96,)),
    # Workstation and consumer parts.
    ("RTX A2000", "8.6", (6, 12)),
    ("RTX A4000", "8.6", (16,)),
    ("RTX A4500", "8.6", (20,)),
    ("RTX A5000", "8.6", (24,)),
    ("RTX A6000", "8.6", (48,)),
    ("RTX 4000 Ada", "8.9", (20,)),
    ("RTX 5000 Ada", "8.9", (32,)),
    ("RTX 6000 Ada", "8.9", (48,)),
    ("Quadro RTX 4000", "7.5", (8,)),
    ("Quadro RTX 5000", "7.5", (16,)),
    ("Quadro RTX 6000", "7.5", (24,)),
    ("Quadro RTX 8000", "7.5", (48,)),
    ("TITAN RTX", "7.5", (24,)),
    ("TITAN V", "7.0", (12,)),
    ("TITAN Xp", "6.1", (12,)),
    ("GTX 1060", "6.1", (3, 6)),
    ("GTX 1070", "6.1", (8,)),
    ("GTX 1080", "6.1", (8, 11)),
    ("GTX 1650", "7.5", (4,)),
    ("GTX 1660", "7.5", (6,)),
    ("RTX 2060", "7.5", (6, 12)),
    ("RTX 2070", "7.5", (8,)),
    ("RTX 2080", "7.5", (8, 11)),
    ("RTX 3060", "8.6", (8, 12)),
    ("RTX 3070", "8.6", (8,)),
    ("RTX 3080", "8.6", (10, 12)),
    ("RTX 3090", "8.6", (24,)),
    ("RTX 4060", "8.9", (8, 16)),
    ("RTX 4070", "8.9", (12, 16)),
    ("RTX 4080", "8.9", (16,)),
    ("RTX 4090", "8.9", (24,)),
    ("RTX 5060", "12.0", (8, 16)),
    ("RTX 5070", "12.0", (12, 16)),
    ("RTX 5080", "12.0", (16,)),
    ("RTX 5090", "12.0", (32,)),
)

# Longest first, so "A100SXM4" reads as A100 and not A10, "L40S" as L40S and not L4.
_MODELS_LONGEST_FIRST = sorted(GPU_FACTS, key=len, reverse=True)
_ALIASES = {"RTXPRO6000": "RTXPROSERVER6000"}


@lru_cache(maxsize=1024)
def parse_gpu_name(name: str) -> GpuName:
    """Read any spelling of a GPU as its model and the memory size its name says, if any:
    "NVIDIA A100-SXM4-80GB" -> A100 with 80 GB; "A100-80GB" -> A100 with 80 GB; "a10g" ->
    A10G; "H100 80GB HBM3" -> H100 with 80 GB. A model not in the table keeps its normalized
    name (less the size), so two spellings of it still compare equal."""
    squashed, memory = _squash(name)
    for model in _MODELS_LONGEST_FIRST:
        if squashed.startswith(model):
            return GpuName(model, memory)
    for alias, model in _ALIASES.items():
        if squashed.startswith(alias):
            return GpuName(model, memory)
    return GpuName(squashed, memory)


def _squash(name: str) -> tuple[str, float | None]:
    """The name normalized with its memory size taken out, and that size."""
    match = _MEMORY.search(name)
    memory = float(match.group(1)) if match else None
    rest = name[: match.start()] + " " + name[match.end() :] if match else name
    squashed = normalize_gpu_name(rest)
    return _ALIASES.get(squashed, squashed), memory


def is_known_model(name: str) -> bool:
    """Whether a name spells a model of the table: the model, optionally followed by a form
    factor ("A100-SXM4", "H100 NVL") or a size. More digits make another model: an "A101"
    would read as an A10 but is not one."""
    model = parse_gpu_name(name).model
    if model not in GPU_FACTS:
        return False
    rest = _squash(name)[0][len(model) :]
    return not rest[:1].isdigit()


def closest_models(name: str, count: int = 3) -> list[str]:
    """The table's models nearest to a name, as the table spells them, nearest first."""
    squashed = _squash(name)[0]
    keys = difflib.get_close_matches(squashed, list(GPU_FACTS), n=count, cutoff=0.5)
    return [GPU_FACTS[key].name for key in keys]


def gpu_facts(name: str | None) -> GpuFacts | None:
    if not name:
        return None
    return GPU_FACTS.get(parse_gpu_name(name).model)


def cuda_capability(name: str | None) -> str | None:
    facts = gpu_facts(name)
    return facts.compute_capability if facts else None


def uses_host_memory(name: str | None) -> bool:
    facts = gpu_facts(name)
    return facts is not None and facts.memory_kind == "unified"


def nominal_memory_gb(name: str | None, reported_gb: float | None) -> float | None:
    """The size a device is sold with, from its name and the memory it reports.

    A size in the name wins when the model is sold with it ("A100-SXM4-80GB"); else the
    table's size nearest above what is reported, when the report comes within 15% of it
    (drivers keep some memory for themselves, and GiB are smaller than GB); else the report
    itself. A known model that reports nothing has its smallest size."""
    if not name:
        return reported_gb
    parsed = parse_gpu_name(name)
    facts = GPU_FACTS.get(parsed.model)
    # A size the model is sold with; not the system's ("NVIDIA GH200 480GB" has 96 GB of HBM).
    if parsed.memory_gb is not None and (facts is None or parsed.memory_gb in facts.memory_sizes):
        return parsed.memory_gb
    if facts is None:
        return reported_gb
    if reported_gb is None:
        return facts.memory_gb
    for size in facts.memory_sizes:
        if reported_gb <= size * 1.02 and reported_gb >= size * 0.85:
            return size
    return reported_gb


def gpu_matches(wanted: GpuName, name: str | None, memory_gb: float | None) -> bool:
    """Whether a device called ``name`` with ``memory_gb`` (per device) is the wanted model,
    with at least the wanted memory when the request names a size."""
    if not name:
        return False
    if parse_gpu_name(name).model != wanted.model:
        return False
    if wanted.memory_gb is None:
        return True
    nominal = nominal_memory_gb(name, memory_gb)
    return nominal is not None and nominal >= wanted.memory_gb


def any_gpu_matches(wanted: tuple[GpuName, ...], name: str | None, memory_gb: float | None) -> bool:
    return not wanted or any(gpu_matches(w, name, memory_gb) for w in wanted)


def describe_models(wanted: tuple[GpuName, ...] | list[GpuName]) -> str:
    """ "A100 or H100-80GB"."""
    return " or ".join(str(w) for w in wanted)
