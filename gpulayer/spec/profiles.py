"""Runtime profiles: shorthands for common accelerator + framework requirements.

The table is data so that docs, validation and the CLI read it from one place.
A framework key with an empty specifier (``torch.cuda``) is a marker: a capability the
worker must report, not a package version.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True)
class Profile:
    name: str
    accelerator: str
    frameworks: Mapping[str, str] = field(default_factory=dict)


def _profile(name: str, accelerator: str, **frameworks: str) -> Profile:
    return Profile(name, accelerator, MappingProxyType(frameworks))


PROFILES: Mapping[str, Profile] = MappingProxyType(
    {
        p.name: p
        for p in (
            _profile("pytorch-cpu", "cpu", torch=">=2.1"),
            _profile("pytorch-cuda", "cuda", **{"torch": ">=2.1", "torch.cuda": ""}),
            _profile("pytorch-mps", "mps", **{"torch": ">=2.1", "torch.mps": ""}),
            _profile("jax-cuda", "cuda", jax=">=0.4", jaxlib=">=0.4"),
            _profile("cupy-cuda", "cuda", cupy=">=12"),
            _profile("mlx", "mps", mlx=">=0.10"),
        )
    }
)

PROFILE_NAMES: tuple[str, ...] = tuple(PROFILES)
