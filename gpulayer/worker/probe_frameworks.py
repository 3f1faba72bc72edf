"""Installed distributions and the capability markers they imply, read from package metadata.

Nothing here imports an ML framework: importing torch costs seconds and may initialise a GPU
driver. Names are PEP 503-normalized so that a JobSpec key "Torch" or "scikit_learn" matches
what a worker reports; :func:`framework_key` applies the same rule to a requirement key.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpulayer.spec.models import Accelerator

_SEPARATOR_RUNS = re.compile(r"[-_.]+")
_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_METADATA_SUFFIXES = (".dist-info", ".egg-info")


def canonical_name(name: str) -> str:
    """PEP 503: lower case, every run of - _ . becomes one -."""
    return _SEPARATOR_RUNS.sub("-", name).lower()


@dataclass(frozen=True)
class InstalledDistribution:
    name: str
    """PEP 503-normalized."""
    version: str
    metadata_path: Path
    """The .dist-info / .egg-info directory, or an .egg-info file."""

    @property
    def local_version(self) -> str:
        """The part after "+" (PEP 440 local label), as in 2.3.0+cu121; "" when none."""
        return self.version.partition("+")[2].lower()

    def requirement_names(self) -> list[str]:
        """Normalized names from Requires-Dist, whatever their environment markers."""
        return [
            canonical_name(match.group(1))
            for value in _read_headers(metadata_file(self.metadata_path)).get("requires-dist", [])
            if (match := _REQUIREMENT_NAME.match(value))
        ]


def metadata_file(metadata_path: Path) -> Path:
    """The file holding the headers of a .dist-info / .egg-info entry."""
    if metadata_path.name.endswith(".dist-info"):
        return metadata_path / "METADATA"
    if metadata_path.is_dir():
        return metadata_path / "PKG-INFO"
    return metadata_path  # an .egg-info file is the PKG-INFO itself


def _read_headers(path: Path) -> dict[str, list[str]]:
    """The RFC 822 header block of a METADATA/PKG-INFO file, keys lower-cased.

    The email parser importlib.metadata uses costs ~0.5 ms a file; this reads only the headers.
    """
    headers: dict[str, list[str]] = {}
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line in ("\n", "\r\n"):
                    break  # the body (long description) starts here
                if line[0] in " \t":
                    # A folded continuation (a License text); a blank line inside one is
                    # written as indentation only, so it is not the end of the headers.
                    continue
                key, sep, value = line.partition(":")
                if sep:
                    headers.setdefault(key.strip().lower(), []).append(value.strip())
    except OSError:
        return {}
    return headers


def _from_entry(directory: Path, entry: str) -> InstalledDistribution | None:
    suffix = next((s for s in _METADATA_SUFFIXES if entry.endswith(s)), None)
    if suffix is None:
        return None
    path = directory / entry
    # Wheel-installed metadata is named "<name>-<version>.dist-info" with "-" escaped in both
    # parts, and eggs "<name>-<version>-py3.11.egg-info": reading the name costs no I/O.
    name, _, rest = entry[: -len(suffix)].partition("-")
    version = rest.split("-")[0]
    # A hand-made entry with unescaped dashes ("my-pkg-1.0.dist-info") splits wrongly; every
    # PEP 440 version starts with a digit, so anything else sends us to the file.
    if not name or not version[:1].isdigit():
        headers = _read_headers(metadata_file(path))
        name = (headers.get("name") or [name])[0]
        version = (headers.get("version") or [""])[0]
        if not name or not version:
            return None
    return InstalledDistribution(canonical_name(name), version, path)


def default_search_path() -> list[str]:
    # "" (the current directory) is left out: a stray .dist-info where the worker happens to
    # run is not something a job would import.
    return [p for p in sys.path if p]


def installed_distributions(
    search_path: Sequence[str] | None = None,
) -> dict[str, InstalledDistribution]:
    """Every distribution on the import path, by normalized name.

    Like importlib.metadata, the first entry on the path wins when a name is installed twice.
    """
    found: dict[str, InstalledDistribution] = {}
    for entry in default_search_path() if search_path is None else search_path:
        directory = Path(entry)
        try:
            names = sorted(e.name for e in os.scandir(directory))
        except OSError:
            continue  # a zip on sys.path, or a directory that went away
        for name in names:
            dist = _from_entry(directory, name)
            if dist is not None and dist.name not in found:
                found[dist.name] = dist
    return found


# --- Aliases ------------------------------------------------------------------------------------

# Import names that ship under per-platform distribution names. JobSpecs ask for "cupy", but
# pip installs "cupy-cuda12x"; the worker reports the import name too so such a spec matches.
FRAMEWORK_ALIASES: Mapping[str, tuple[str, ...]] = {
    "cupy": ("cupy-cuda", "cupy-rocm"),
}


def framework_versions(installed: Mapping[str, InstalledDistribution]) -> dict[str, str]:
    versions = {name: dist.version for name, dist in sorted(installed.items())}
    for alias, prefixes in FRAMEWORK_ALIASES.items():
        if alias in versions:
            continue
        providers = sorted(n for n in versions if n.startswith(prefixes))
        if providers:
            versions[alias] = versions[providers[0]]
    return versions


# --- Markers ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalVersion:
    """The distribution's version carries a local label such as +cu121 or +rocm6.2."""

    dist: str
    prefix: str

    def holds(self, installed: Mapping[str, InstalledDistribution]) -> bool:
        dist = installed.get(self.dist)
        return dist is not None and dist.local_version.startswith(self.prefix)


@dataclass(frozen=True)
class RequiresInstalled:
    """The distribution depends on another that is installed (PyPI's torch wheels pull the
    CUDA runtime as nvidia-cuda-runtime-cu12)."""

    dist: str
    requirement_prefix: str

    def holds(self, installed: Mapping[str, InstalledDistribution]) -> bool:
        dist = installed.get(self.dist)
        if dist is None:
            return False
        return any(
            name.startswith(self.requirement_prefix) and name in installed
            for name in dist.requirement_names()
        )


@dataclass(frozen=True)
class InstalledPrefix:
    """Some installed distribution's name starts with ``prefix`` (jax-cuda12-plugin)."""

    prefix: str

    def holds(self, installed: Mapping[str, InstalledDistribution]) -> bool:
        return any(name.startswith(self.prefix) for name in installed)


Evidence = LocalVersion | RequiresInstalled | InstalledPrefix


@dataclass(frozen=True)
class MarkerRule:
    """``marker`` holds when the worker has a GPU of ``accelerator``, every distribution in
    ``requires`` is installed, and any one piece of ``evidence`` holds (none needed if empty)."""

    marker: str
    accelerator: Accelerator
    requires: tuple[str, ...] = ()
    evidence: tuple[Evidence, ...] = ()

    def holds(
        self,
        installed: Mapping[str, InstalledDistribution],
        accelerator: str,
        gpu_count: int,
    ) -> bool:
        if accelerator != self.accelerator or gpu_count < 1:
            return False
        if not all(name in installed for name in self.requires):
            return False
        return not self.evidence or any(e.holds(installed) for e in self.evidence)


MARKER_RULES: tuple[MarkerRule, ...] = (
    MarkerRule(
        "torch.cuda",
        "cuda",
        requires=("torch",),
        evidence=(LocalVersion("torch", "cu"), RequiresInstalled("torch", "nvidia-cuda-runtime")),
    ),
    MarkerRule(
        "torch.rocm", "rocm", requires=("torch",), evidence=(LocalVersion("torch", "rocm"),)
    ),
    # Every torch wheel for macOS on arm64 is built with the MPS backend.
    MarkerRule("torch.mps", "mps", requires=("torch",)),
    MarkerRule(
        "jax.cuda",
        "cuda",
        requires=("jax",),
        evidence=(InstalledPrefix("jax-cuda"), LocalVersion("jaxlib", "cuda")),
    ),
    MarkerRule("cupy.cuda", "cuda", evidence=(InstalledPrefix("cupy-cuda"),)),
)

MARKER_SUFFIXES: frozenset[str] = frozenset(r.marker.rpartition(".")[2] for r in MARKER_RULES)


def markers_for(
    installed: Mapping[str, InstalledDistribution],
    accelerator: str,
    gpu_count: int,
    rules: Iterable[MarkerRule] = MARKER_RULES,
) -> list[str]:
    return [r.marker for r in rules if r.holds(installed, accelerator, gpu_count)]


def framework_key(name: str) -> str:
    """A JobSpec frameworks key in the form workers report it.

    "Torch" -> "torch", "scikit_learn" -> "scikit-learn", "Torch.CUDA" -> "torch.cuda".
    A dotted key is a marker only when its last part names an accelerator a marker rule uses;
    otherwise the dots belong to the distribution name ("zope.interface" -> "zope-interface").
    """
    package, dot, suffix = name.strip().rpartition(".")
    if dot and package and suffix.lower() in MARKER_SUFFIXES:
        return f"{canonical_name(package)}.{suffix.lower()}"
    return canonical_name(name.strip())


def is_marker_key(key: str) -> bool:
    package, dot, suffix = framework_key(key).rpartition(".")
    return bool(dot and package and suffix in MARKER_SUFFIXES)
