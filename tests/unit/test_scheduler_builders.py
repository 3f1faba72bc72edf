"""Builders for the scheduler tests: jobs, workers and seeded random fleets."""

from __future__ import annotations

import random
from typing import Any

from gpulayer.scheduler import WorkerIndex, WorkerSnapshot, idle_snapshot
from gpulayer.scheduler.index import signature
from gpulayer.spec import JobSpec
from gpulayer.spec.capabilities import GpuDevice, WorkerCapabilities

A100_80 = ("NVIDIA A100", 80.0, "8.0")
A100_40 = ("NVIDIA A100", 40.0, "8.0")
H100 = ("NVIDIA H100", 80.0, "9.0")
A10G = ("NVIDIA A10G", 24.0, "8.6")
L4 = ("NVIDIA L4", 24.0, "8.9")
T4 = ("NVIDIA T4", 16.0, "7.5")
V100 = ("NVIDIA V100", 32.0, "7.0")
CUDA_MODELS = (A100_80, A100_40, H100, A10G, L4, T4, V100)


def job(
    *,
    placement: dict[str, Any] | None = None,
    strategy: str | None = None,
    **resources: Any,
) -> JobSpec:
    place = dict(placement or {})
    if strategy is not None:
        place["strategy"] = strategy
    return JobSpec.model_validate(
        {
            "workload": {"kind": "command", "command": ["python", "train.py"]},
            "resources": resources,
            "placement": place,
        }
    )


def caps(
    *,
    accelerator: str = "cpu",
    gpus: tuple[tuple[str, float | None, str | None], ...] = (),
    memory_kind: str | None = "dedicated",
    **fields: Any,
) -> WorkerCapabilities:
    devices = [
        GpuDevice(
            index=i,
            name=name,
            memory_gb=memory,
            memory_kind=memory_kind,
            compute_capability=capability,
            uuid=f"GPU-{random.random()}",
        )
        for i, (name, memory, capability) in enumerate(gpus)
    ]
    fields.setdefault("cpu_cores", 16)
    fields.setdefault("memory_gb", 128.0)
    return WorkerCapabilities.model_validate(
        {"accelerator": accelerator, "gpus": devices, **fields}
    )


def cuda_caps(model: tuple[str, float, str] = A100_80, count: int = 4, **fields: Any):
    fields.setdefault("frameworks", {"torch": "2.3.0"})
    fields.setdefault("markers", ["torch.cuda"])
    return caps(accelerator="cuda", gpus=(model,) * count, **fields)


def worker(
    worker_id: str,
    capabilities: WorkerCapabilities | None = None,
    *,
    labels: dict[str, str] | None = None,
    state: str = "ready",
    busy_gpus: tuple[int, ...] = (),
    busy_cores: float = 0,
    busy_memory: float = 0,
    running: int | None = None,
) -> WorkerSnapshot:
    c = capabilities or caps()
    base = idle_snapshot(worker_id, c, labels=labels, state=state)
    memory = None if base.free_memory_gb is None else base.free_memory_gb - busy_memory
    return WorkerSnapshot(
        id=worker_id,
        name=worker_id,
        labels=base.labels,
        capabilities=c,
        state=state,
        free_gpus=tuple(i for i in base.free_gpus if i not in busy_gpus),
        free_cpu_cores=c.cpu_cores - busy_cores,
        free_memory_gb=memory,
        running=(1 if busy_gpus or busy_cores else 0) if running is None else running,
    )


# --- random fleets and jobs -----------------------------------------------------------------


def random_caps(rng: random.Random) -> WorkerCapabilities:
    roll = rng.random()
    common: dict[str, Any] = {
        "cpu_cores": rng.choice([4, 8, 16, 32, 64]),
        "memory_gb": rng.choice([16.0, 32.0, 64.0, 256.0, None]),
        "disk_gb": rng.choice([50.0, 200.0, 1000.0, None]),
        "os": rng.choice(["linux", "linux", "darwin"]),
        "cpu_arch": rng.choice(["x86_64", "x86_64", "aarch64", "arm64"]),
        "python_version": rng.choice(["3.10.12", "3.11.4", "3.12.1"]),
        "provider": rng.choice([None, "aws", "gcp"]),
        "region": rng.choice([None, "us-east-1", "europe-west4"]),
        "hostname": f"host-{rng.randrange(10**6)}",
        "zone": rng.choice(["a", "b", "c"]),
    }
    torch = rng.choice(["2.1.0", "2.3.1", "2.5.0.dev20240801"])
    if roll < 0.55:
        if rng.random() < 0.8:
            gpus = (rng.choice(CUDA_MODELS),) * rng.choice([1, 2, 4, 8])
        else:  # mixed devices in one box
            gpus = tuple(rng.choice(CUDA_MODELS) for _ in range(rng.choice([2, 3, 4])))
        return caps(
            accelerator="cuda",
            gpus=gpus,
            frameworks={"torch": torch, "jax": "0.4.30", "JaxLib": "0.4.30"},
            markers=rng.choice([["torch.cuda"], []]),
            **common,
        )
    if roll < 0.65:
        return caps(
            accelerator="mps",
            gpus=(("Apple M2 Max", rng.choice([32.0, 64.0]), None),),
            memory_kind="unified",
            frameworks={"torch": torch, "mlx": "0.16.0"},
            markers=["torch.mps"],
            **common,
        )
    if roll < 0.7:
        return caps(accelerator="rocm", gpus=(("AMD MI250", 64.0, None),), **common)
    return caps(frameworks={"torch": torch, "numpy": "1.26.4"}, **common)


def random_worker(
    rng: random.Random, worker_id: str, template: WorkerCapabilities | None = None
) -> WorkerSnapshot:
    c = random_caps(rng) if template is None else template
    c = c.model_copy(update={"hostname": worker_id, "zone": rng.choice(["a", "b", "c"])})
    labels = {"pool": rng.choice(["a", "b"]), "team": f"t{rng.randrange(8)}"}
    if rng.random() < 0.3:
        labels["tier"] = "gold"
    busy = tuple(g.index for g in c.gpus if rng.random() < 0.4)
    return worker(
        worker_id,
        c,
        labels=labels,
        state=rng.choice(["ready"] * 8 + ["draining", "lost"]),
        busy_gpus=busy,
        busy_cores=rng.choice([0, 0, 1, 2.5, c.cpu_cores / 2, c.cpu_cores]),
        busy_memory=rng.choice([0.0, 8.0, 16.0]),
        running=rng.randrange(0, 5),
    )


def random_fleet(rng: random.Random, size: int, kinds: int = 25) -> list[WorkerSnapshot]:
    """``size`` workers sharing ``kinds`` hardware/software signatures, in random id order."""
    templates = [random_caps(rng) for _ in range(kinds)]
    return [
        random_worker(rng, f"w{i:05d}", rng.choice(templates))
        for i in rng.sample(range(10 * size), size)
    ]


def random_job(rng: random.Random, worker_ids: list[str] | None = None) -> JobSpec:
    accelerator = rng.choice(["cpu", "cpu", "cuda", "cuda", "cuda", "mps", "rocm"])
    resources: dict[str, Any] = {
        "accelerator": accelerator,
        "cpu_cores": rng.choice([0.5, 1, 2, 4, 8, 16, 48]),
    }
    if accelerator != "cpu":
        resources["gpu_count"] = rng.choice([1, 1, 2, 3, 4, 8])
        if rng.random() < 0.5:
            resources["gpu_memory_gb"] = rng.choice([16, 24, 40, 60, 80])
        if rng.random() < 0.2:
            resources["gpu_memory_kind"] = rng.choice(["dedicated", "unified"])
    if accelerator == "cuda" and rng.random() < 0.4:
        resources["min_cuda_compute_capability"] = rng.choice(["7.0", "8.0", "8.6", "9.0"])
    if rng.random() < 0.3:
        resources["memory_gb"] = rng.choice([4, 16, 60, 200])
    if rng.random() < 0.2:
        resources["disk_gb"] = rng.choice([10, 100, 500])
    if rng.random() < 0.2:
        resources["os"] = rng.choice([["linux"], ["darwin"], ["linux", "darwin"]])
    if rng.random() < 0.2:
        resources["cpu_arch"] = rng.choice([["x86_64"], ["arm64"]])
    if rng.random() < 0.4:
        resources["frameworks"] = rng.choice(
            [
                {"torch": ">=2.2"},
                {"torch": ""},
                {"torch.cuda": ""},
                {"jaxlib": ">=0.4"},
                {"mlx": ""},
            ]
        )
    if rng.random() < 0.2:
        resources["python"] = rng.choice([">=3.11", "<3.12"])
    placement: dict[str, Any] = {}
    if rng.random() < 0.15:
        placement["providers"] = [rng.choice(["aws", "gcp"])]
    if rng.random() < 0.15:
        placement["regions"] = [rng.choice(["us-east-1", "europe-west4"])]
    if rng.random() < 0.3:
        placement["worker_labels"] = rng.choice(
            [{"pool": "a"}, {"team": "t3"}, {"pool": "b", "tier": "gold"}, {"pool": "zzz"}]
        )
    if worker_ids and rng.random() < 0.1:
        placement["worker_ids"] = rng.sample(worker_ids, min(3, len(worker_ids)))
    strategy = rng.choice(["spread", "first_fit", "most_free_memory"])
    return job(placement=placement, strategy=strategy, **resources)


# --- the builders themselves ----------------------------------------------------------------


def test_worker_builder_marks_busy_gpus_and_cores() -> None:
    w = worker("w1", cuda_caps(count=4), busy_gpus=(1, 2), busy_cores=3)
    assert w.free_gpus == (0, 3)
    assert w.free_cpu_cores == 13
    assert w.running == 1


def test_random_fleet_has_many_workers_per_signature() -> None:
    fleet = random_fleet(random.Random(1), 300)
    signatures = {signature(w.capabilities) for w in fleet}
    assert 10 < len(signatures) <= 25
    assert len({w.capabilities.hostname for w in fleet}) == len(fleet)
    assert WorkerIndex(fleet).group_count == len(signatures)
