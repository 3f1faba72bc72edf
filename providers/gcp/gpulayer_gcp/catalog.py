"""The price catalog: machine types, GPUs, zones and prices, shipped with the plugin (offline
use, tests) and rebuilt from the Cloud Billing Catalog API by :func:`refresh_catalog` into the
cache directory, where it takes precedence.

GCE bills a machine as its host (vCPUs and memory) plus each attached GPU, so the catalog keeps
the two apart: ``regions.R.machines.TYPE`` is the host's [on-demand, spot] USD per hour and
``regions.R.gpus.ACCELERATOR`` one GPU's. A2, A3 and G2 types come with fixed GPUs
(``machine_types.TYPE.accelerator``); N1 types take T4, V100, P100 or P4 in the counts
``accelerators.A.attach`` allows (count -> most vCPUs of the host).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

CATALOG_NAME = "price_catalog.json"


@dataclass(frozen=True)
class MachineShape:
    name: str
    vcpus: int
    memory_gb: float
    accelerator: str | None = None
    accelerator_count: int = 0


@dataclass(frozen=True)
class AcceleratorFacts:
    name: str
    """GCE's accelerator type, e.g. nvidia-tesla-t4."""
    gpu: str
    """gpulayer's GPU name, e.g. T4."""
    memory_gb: float
    attach: Mapping[int, int] = field(default_factory=dict)
    """For N1 hosts: GPU count -> most vCPUs of a host it can be attached to."""


@dataclass(frozen=True)
class RegionPrices:
    zones: tuple[str, ...]
    machines: Mapping[str, tuple[float | None, float | None]]
    gpus: Mapping[str, tuple[float | None, float | None]]
    accelerator_zones: Mapping[str, tuple[str, ...]]


@dataclass(frozen=True)
class PriceCatalog:
    machine_types: Mapping[str, MachineShape]
    accelerators: Mapping[str, AcceleratorFacts]
    regions: Mapping[str, RegionPrices]
    as_of: str = ""
    source: str = ""
    currency: str = "USD"
    sources: tuple[str, ...] = ()
    notes: str = ""
    price_sources: Mapping[str, str] = field(default_factory=dict)
    """Machine type -> where its prices came from, where that is not what ``sources`` says of
    every row (a type added from another public source, or known but not priced)."""
    path: Path | None = field(default=None, compare=False)

    def accelerator_by_gpu(self, gpu: str) -> AcceleratorFacts | None:
        from gpulayer.cloud import normalize_gpu_name

        wanted = normalize_gpu_name(gpu)
        for facts in self.accelerators.values():
            if normalize_gpu_name(facts.gpu) == wanted:
                return facts
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "sources": list(self.sources),
            "notes": self.notes,
            "price_sources": dict(sorted(self.price_sources.items())),
            "as_of": self.as_of,
            "currency": self.currency,
            "machine_types": {
                name: _shape_json(shape) for name, shape in sorted(self.machine_types.items())
            },
            "accelerators": {
                name: _accelerator_json(facts) for name, facts in sorted(self.accelerators.items())
            },
            "regions": {
                name: {
                    "zones": list(prices.zones),
                    "machines": {k: list(v) for k, v in sorted(prices.machines.items())},
                    "gpus": {k: list(v) for k, v in sorted(prices.gpus.items())},
                    "accelerator_zones": {
                        k: list(v) for k, v in sorted(prices.accelerator_zones.items())
                    },
                }
                for name, prices in sorted(self.regions.items())
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], path: Path | None = None) -> PriceCatalog:
        shapes = {
            str(name): MachineShape(
                name=str(name),
                vcpus=int(body["vcpus"]),
                memory_gb=float(body["memory_gb"]),
                accelerator=body.get("accelerator"),
                accelerator_count=int(body.get("accelerator_count", 0)),
            )
            for name, body in data.get("machine_types", {}).items()
        }
        accelerators = {
            str(name): AcceleratorFacts(
                name=str(name),
                gpu=str(body["gpu"]),
                memory_gb=float(body["memory_gb"]),
                attach={int(k): int(v) for k, v in (body.get("attach") or {}).items()},
            )
            for name, body in data.get("accelerators", {}).items()
        }
        regions = {
            str(name): RegionPrices(
                zones=tuple(body.get("zones", ())),
                machines={k: _pair(v) for k, v in body.get("machines", {}).items()},
                gpus={k: _pair(v) for k, v in body.get("gpus", {}).items()},
                accelerator_zones={
                    k: tuple(v) for k, v in body.get("accelerator_zones", {}).items()
                },
            )
            for name, body in data.get("regions", {}).items()
        }
        return cls(
            machine_types=shapes,
            accelerators=accelerators,
            regions=regions,
            as_of=str(data.get("as_of", "")),
            source=str(data.get("source", "")),
            currency=str(data.get("currency", "USD")),
            sources=tuple(str(s) for s in data.get("sources", ())),
            notes=str(data.get("notes", "")),
            price_sources={str(k): str(v) for k, v in data.get("price_sources", {}).items()},
            path=path,
        )


def _pair(value: Any) -> tuple[float | None, float | None]:
    on_demand, spot = [*list(value), None, None][:2]
    return (
        float(on_demand) if on_demand is not None else None,
        float(spot) if spot is not None else None,
    )


def _shape_json(shape: MachineShape) -> dict[str, Any]:
    body: dict[str, Any] = {"vcpus": shape.vcpus, "memory_gb": shape.memory_gb}
    if shape.accelerator:
        body.update(accelerator=shape.accelerator, accelerator_count=shape.accelerator_count)
    return body


def _accelerator_json(facts: AcceleratorFacts) -> dict[str, Any]:
    body: dict[str, Any] = {"gpu": facts.gpu, "memory_gb": facts.memory_gb}
    if facts.attach:
        body["attach"] = {str(k): v for k, v in sorted(facts.attach.items())}
    return body


def shipped_catalog() -> PriceCatalog:
    text = (resources.files("gpulayer_gcp") / "data" / CATALOG_NAME).read_text()
    return PriceCatalog.from_json(json.loads(text))


def load_catalog(cache_dir: Path | None) -> PriceCatalog:
    """The refreshed catalog in ``cache_dir`` when there is a readable one, else the shipped."""
    if cache_dir is not None:
        refreshed = Path(cache_dir) / CATALOG_NAME
        try:
            return PriceCatalog.from_json(json.loads(refreshed.read_text()), refreshed)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    return shipped_catalog()


def save_catalog(catalog: PriceCatalog, cache_dir: Path) -> Path:
    from gpulayer.cloud import write_json_atomically

    return write_json_atomically(Path(cache_dir) / CATALOG_NAME, catalog.to_json(), indent=1)
