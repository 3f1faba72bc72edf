"""Feasibility checks: each accepts what it should and names why it rejects."""

from __future__ import annotations

from typing import Any

import pytest

from gpulayer.scheduler import CHECKS, Check, check, reasons_never, reasons_now
from gpulayer.scheduler import feasibility as f
from tests.unit.test_scheduler_builders import (
    A10G,
    A100_80,
    H100,
    V100,
    caps,
    cuda_caps,
    job,
    worker,
)

CUDA4 = {"caps": {"accelerator": "cuda", "gpus": (A100_80,) * 4}}
MIXED = {"caps": {"accelerator": "cuda", "gpus": (A100_80, A10G)}}
MPS = {
    "caps": {
        "accelerator": "mps",
        "gpus": (("Apple M2 Max", 64.0, None),),
        "memory_kind": "unified",
    }
}


def _worker(spec: dict[str, Any]) -> Any:
    spec = dict(spec)
    capabilities = caps(**spec.pop("caps", {}))
    return worker(spec.pop("id", "w1"), capabilities, **spec)


# (check, job fields, worker spec, expected: None to accept, else a phrase of the reason)
CASES = [
    # accelerator
    (f.accelerator, {"accelerator": "cuda"}, CUDA4, None),
    (f.accelerator, {}, CUDA4, None),  # a CPU job runs on any worker
    (f.accelerator, {"accelerator": "cuda"}, {}, "needs a cuda accelerator, has cpu"),
    (f.accelerator, {"accelerator": "mps"}, CUDA4, "needs a mps accelerator, has cuda"),
    (
        f.accelerator,
        {"accelerator": "rocm"},
        {"caps": {"accelerator": "rocm", "gpus": (("AMD MI250", 64.0, None),)}},
        "rocm jobs are not scheduled yet",
    ),
    # gpu_count
    (f.gpu_count, {"accelerator": "cuda", "gpu_count": 4}, CUDA4, None),
    (
        f.gpu_count,
        {"accelerator": "cuda", "gpu_count": 8},
        CUDA4,
        "needs 8 cuda GPUs, has 4 x NVIDIA A100 (80 GB)",
    ),
    (
        f.gpu_count,
        {"accelerator": "cuda", "gpu_count": 2},
        {**CUDA4, "busy_gpus": (0, 1, 2)},
        "needs 2 cuda GPUs, 1 of 4 free",
    ),
    (f.gpu_count, {"accelerator": "cuda"}, {}, None),  # accelerator explains instead
    # gpu_models: any of the names, read through the one GPU name normalization
    (f.gpu_models, {"accelerator": "cuda", "gpu_models": ["a100"]}, MIXED, None),
    (f.gpu_models, {"accelerator": "cuda", "gpu_models": ["H100", "A10G"]}, MIXED, None),
    (f.gpu_models, {"accelerator": "cuda", "gpu_models": ["A100-80GB"]}, MIXED, None),
    (
        f.gpu_models,
        {"accelerator": "cuda", "gpu_count": 2, "gpu_models": ["A100"]},
        MIXED,
        "needs 2 cuda GPUs of model A100, has 1 x NVIDIA A100 (80 GB), 1 x NVIDIA A10G (24 GB)",
    ),
    (
        f.gpu_models,
        {"accelerator": "cuda", "gpu_models": ["A100-80GB"]},
        {"caps": {"accelerator": "cuda", "gpus": (("NVIDIA A100-SXM4-40GB", 39.4, "8.0"),)}},
        "of model A100-80GB, has 1 x NVIDIA A100-SXM4-40GB (39.4 GB)",
    ),
    (f.gpu_models, {"accelerator": "cuda", "gpu_models": ["H100"]}, CUDA4, "of model H100"),
    # gpu_memory_gb: the nominal size counts, not the few GB less a driver reports
    (
        f.gpu_memory_gb,
        {"accelerator": "cuda", "gpu_memory_gb": 24},
        {"caps": {"accelerator": "cuda", "gpus": (("NVIDIA A10G", 22.35, "8.6"),)}},
        None,
    ),
    (
        f.gpu_memory_gb,
        {"accelerator": "cuda", "gpu_memory_gb": 24},
        {"caps": {"accelerator": "cuda", "gpus": (("NVIDIA L4", 22.35, "8.9"),)}},
        None,
    ),
    (
        f.gpu_memory_gb,
        {"accelerator": "cuda", "gpu_memory_gb": 25},
        {"caps": {"accelerator": "cuda", "gpus": (("NVIDIA L4", 22.35, "8.9"),)}},
        "with >= 25 GB",
    ),
    # gpu_memory_gb: per device, counting only devices that meet it
    (f.gpu_memory_gb, {"accelerator": "cuda", "gpu_memory_gb": 40}, MIXED, None),
    (
        f.gpu_memory_gb,
        {"accelerator": "cuda", "gpu_count": 2, "gpu_memory_gb": 40},
        MIXED,
        "needs 2 cuda GPUs with >= 40 GB, has 1 x NVIDIA A100 (80 GB), 1 x NVIDIA A10G (24 GB)",
    ),
    (
        f.gpu_memory_gb,
        {"accelerator": "cuda", "gpu_memory_gb": 40},
        {**MIXED, "busy_gpus": (0,)},
        "has 1 x NVIDIA A10G (24 GB) free of 2",
    ),
    # gpu_memory_kind
    (f.gpu_memory_kind, {"accelerator": "mps", "gpu_memory_kind": "unified"}, MPS, None),
    (
        f.gpu_memory_kind,
        {"accelerator": "mps", "gpu_memory_kind": "dedicated"},
        MPS,
        "with dedicated memory, has 1 x Apple M2 Max (64 GB, unified)",
    ),
    # min_cuda_compute_capability, compared as version tuples
    (
        f.min_cuda_compute_capability,
        {"accelerator": "cuda", "min_cuda_compute_capability": "8.0"},
        CUDA4,
        None,
    ),
    (
        f.min_cuda_compute_capability,
        {"accelerator": "cuda", "min_cuda_compute_capability": "9.0"},
        CUDA4,
        "with compute capability >= 9.0, has 4 x NVIDIA A100 (80 GB, compute capability 8.0)",
    ),
    (
        f.min_cuda_compute_capability,
        {"accelerator": "cuda", "min_cuda_compute_capability": "8.9"},
        {"caps": {"accelerator": "cuda", "gpus": (("Future", 80.0, "8.10"),)}},
        None,
    ),
    (
        f.min_cuda_compute_capability,
        {"accelerator": "cuda", "min_cuda_compute_capability": "8.10"},
        {"caps": {"accelerator": "cuda", "gpus": (("Ada", 24.0, "8.9"),)}},
        "compute capability >= 8.10",
    ),
    # gpu_devices: each field met by some device, but no device meets all of them
    (
        f.gpu_devices,
        {"accelerator": "cuda", "gpu_memory_gb": 40, "min_cuda_compute_capability": "8.0"},
        {
            "caps": {
                "accelerator": "cuda",
                "gpus": (("Big old", 80.0, "7.0"), ("Small new", 24.0, "9.0")),
            }
        },
        "needs 1 cuda GPU each with >= 40 GB, compute capability >= 8.0",
    ),
    (
        f.gpu_devices,
        {"accelerator": "cuda", "gpu_memory_gb": 40, "min_cuda_compute_capability": "8.0"},
        {"caps": {"accelerator": "cuda", "gpus": (V100, H100)}},
        None,
    ),
    # cpu_cores
    (f.cpu_cores, {"cpu_cores": 16}, {}, None),
    (f.cpu_cores, {"cpu_cores": 32}, {}, "needs 32 CPU cores, has 16"),
    (f.cpu_cores, {"cpu_cores": 4}, {"busy_cores": 14}, "needs 4 CPU cores, 2 of 16 free"),
    # memory_gb
    (f.memory_gb, {"memory_gb": 128}, {}, None),
    (f.memory_gb, {"memory_gb": 256}, {}, "needs 256 GB memory, has 128 GB"),
    (
        f.memory_gb,
        {"memory_gb": 100},
        {"busy_memory": 64},
        "needs 100 GB memory, 64 of 128 GB free",
    ),
    (f.memory_gb, {"memory_gb": 1}, {"caps": {"memory_gb": None}}, "reports no memory size"),
    # disk_gb
    (f.disk_gb, {"disk_gb": 100}, {"caps": {"disk_gb": 500.0}}, None),
    (f.disk_gb, {"disk_gb": 100}, {"caps": {"disk_gb": 50.0}}, "needs 100 GB disk, has 50 GB"),
    (f.disk_gb, {"disk_gb": 100}, {}, "needs 100 GB disk, reports no disk size"),
    # os and cpu_arch: an empty list means any
    (f.operating_system, {}, {"caps": {"os": "darwin"}}, None),
    (f.operating_system, {"os": ["linux", "darwin"]}, {"caps": {"os": "Darwin"}}, None),
    (
        f.operating_system,
        {"os": ["linux"]},
        {"caps": {"os": "darwin"}},
        "needs os linux, has darwin",
    ),
    (f.cpu_arch, {}, {"caps": {"cpu_arch": "aarch64"}}, None),
    (f.cpu_arch, {"cpu_arch": ["arm64"]}, {"caps": {"cpu_arch": "aarch64"}}, None),
    (f.cpu_arch, {"cpu_arch": ["aarch64"]}, {"caps": {"cpu_arch": "ARM64"}}, None),
    (
        f.cpu_arch,
        {"cpu_arch": ["arm64"]},
        {"caps": {"cpu_arch": "amd64"}},
        "needs cpu_arch aarch64, has x86_64",
    ),
    # frameworks
    (
        f.frameworks,
        {"frameworks": {"torch": ">=2.2"}},
        {"caps": {"frameworks": {"torch": "2.3.0"}}},
        None,
    ),
    (
        f.frameworks,
        {"frameworks": {"torch": ">=2.2"}},
        {"caps": {"frameworks": {"torch": "2.1.0"}}},
        "needs torch>=2.2, has 2.1.0",
    ),
    (
        f.frameworks,
        {"frameworks": {"torch": ">=2.2"}},
        {"caps": {"frameworks": {"torch": "2.5.0.dev20240801"}}},
        None,
    ),
    (
        f.frameworks,
        {"frameworks": {"torch": ">=2.2"}},
        {"caps": {"frameworks": {"torch": "2.3.0+cu121"}}},
        None,
    ),
    (
        f.frameworks,
        {"frameworks": {"scikit_learn": ">=1.4"}},
        {"caps": {"frameworks": {"Scikit-Learn": "1.5.0"}}},
        None,
    ),
    (f.frameworks, {"frameworks": {"jax": ""}}, {"caps": {"frameworks": {"jax": "0.4.30"}}}, None),
    (f.frameworks, {"frameworks": {"jax": ""}}, {}, "needs jax, not installed"),
    (f.frameworks, {"frameworks": {"torch.cuda": ""}}, {"caps": {"markers": ["torch.cuda"]}}, None),
    (
        f.frameworks,
        {"frameworks": {"torch.cuda": ""}},
        {"caps": {"frameworks": {"torch": "2.3.0"}}},
        "needs torch.cuda, not reported",
    ),
    (
        f.frameworks,
        {"frameworks": {"zope.interface": ""}},
        {"caps": {"frameworks": {"zope-interface": "6.4"}}},
        None,
    ),
    (
        f.frameworks,
        {"frameworks": {"torch": ">=2.2"}},
        {"caps": {"frameworks": {"torch": "local"}}},
        "reports version 'local', which is not PEP 440",
    ),
    (
        f.frameworks,
        {"profile": "pytorch-cuda"},
        CUDA4,
        "needs torch>=2.1, not installed; needs torch.cuda, not reported",
    ),
    # python
    (f.python_version, {"python": ">=3.10"}, {"caps": {"python_version": "3.11.4"}}, None),
    (
        f.python_version,
        {"python": ">=3.12"},
        {"caps": {"python_version": "3.11.4"}},
        "needs python >=3.12, has 3.11.4",
    ),
    # an installed pre-release counts, and sorts before its final release
    (f.python_version, {"python": ">=3.12"}, {"caps": {"python_version": "3.13.0rc1"}}, None),
    (
        f.python_version,
        {"python": ">=3.13"},
        {"caps": {"python_version": "3.13.0rc1"}},
        "has 3.13.0rc1",
    ),
]

PLACEMENT_CASES = [
    (f.worker_ids, {"worker_ids": ["w1", "w2"]}, {}, None),
    (f.worker_ids, {"worker_ids": ["w2"]}, {}, "not one of the pinned worker_ids (w2)"),
    (
        f.worker_labels,
        {"worker_labels": {"pool": "a", "team": "x"}},
        {"labels": {"pool": "a", "team": "x", "extra": "1"}},
        None,
    ),
    (
        f.worker_labels,
        {"worker_labels": {"pool": "a", "team": "x"}},
        {"labels": {"pool": "a"}},
        "needs label team=x (has none)",
    ),
    (
        f.worker_labels,
        {"worker_labels": {"pool": "a"}},
        {"labels": {"pool": "b"}},
        "needs label pool=a (has pool=b)",
    ),
    (f.providers, {"providers": ["aws", "gcp"]}, {"caps": {"provider": "gcp"}}, None),
    (
        f.providers,
        {"providers": ["aws"]},
        {"caps": {"provider": "gcp"}},
        "needs provider aws, has gcp",
    ),
    # Not provider-backed (this machine, an on-prem pool): providers and regions do not apply.
    (f.providers, {"providers": ["aws"]}, {}, None),
    (f.regions, {"regions": ["eu-west-1"]}, {"caps": {"region": "lab"}}, None),
    (
        f.regions,
        {"regions": ["eu-west-1"]},
        {"caps": {"provider": "aws", "region": "eu-west-1"}},
        None,
    ),
    (
        f.regions,
        {"regions": ["eu-west-1", "us-east-1"]},
        {"caps": {"provider": "aws", "region": "ap-south-1"}},
        "needs region eu-west-1 or us-east-1, has ap-south-1",
    ),
]


def _case_id(case: tuple[Check, dict[str, Any], dict[str, Any], str | None]) -> str:
    return f"{case[0].name}-{'ok' if case[3] is None else 'no'}"


@pytest.mark.parametrize(("chk", "resources", "spec", "expected"), CASES, ids=map(_case_id, CASES))
def test_resource_check(
    chk: Check, resources: dict[str, Any], spec: dict[str, Any], expected: str | None
) -> None:
    reason = chk(job(**resources), _worker(spec))
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and expected in reason


@pytest.mark.parametrize(
    ("chk", "placement", "spec", "expected"), PLACEMENT_CASES, ids=map(_case_id, PLACEMENT_CASES)
)
def test_placement_check(
    chk: Check, placement: dict[str, Any], spec: dict[str, Any], expected: str | None
) -> None:
    reason = chk(job(placement=placement), _worker(spec))
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and expected in reason


def test_every_check_in_the_chain_has_accept_and_reject_cases() -> None:
    covered: dict[str, set[bool]] = {}
    for chk, _, _, expected in CASES + PLACEMENT_CASES:
        covered.setdefault(chk.name, set()).add(expected is None)
    covered["state"] = {True, False}  # test_state_* below
    missing = [c.name for c in CHECKS if covered.get(c.name) != {True, False}]
    assert missing == []


@pytest.mark.parametrize(
    ("state", "reason"),
    [("ready", None), ("draining", "worker is draining"), ("lost", "worker is lost")],
)
def test_state_check_only_counts_now(state: str, reason: str | None) -> None:
    w = worker("w1", state=state)
    assert f.state(job(), w) == reason
    assert reasons_never(job(), w) == []


# --- the two modes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("resources", "spec", "now_phrase"),
    [
        ({"accelerator": "cuda", "gpu_count": 2}, {**CUDA4, "busy_gpus": (0, 1, 2)}, "1 of 4 free"),
        ({"cpu_cores": 8}, {"busy_cores": 10}, "6 of 16 free"),
        ({"memory_gb": 100}, {"busy_memory": 64}, "64 of 128 GB free"),
        ({}, {"state": "draining"}, "worker is draining"),
        ({"accelerator": "cuda", "gpu_memory_gb": 40}, {**MIXED, "busy_gpus": (0,)}, ">= 40 GB"),
    ],
)
def test_busy_or_draining_is_now_but_not_never(
    resources: dict[str, Any], spec: dict[str, Any], now_phrase: str
) -> None:
    spec_job = job(**resources)
    w = _worker(spec)
    assert reasons_never(spec_job, w) == []
    now = reasons_now(spec_job, w)
    assert len(now) == 1 and now_phrase in now[0]


@pytest.mark.parametrize(
    ("resources", "spec"),
    [
        ({"accelerator": "cuda", "gpu_count": 8}, CUDA4),
        ({"cpu_cores": 64}, {}),
        ({"accelerator": "cuda", "gpu_memory_gb": 100}, CUDA4),
        ({"os": ["windows"]}, {}),
    ],
)
def test_too_small_is_both_never_and_now(resources: dict[str, Any], spec: dict[str, Any]) -> None:
    spec_job = job(**resources)
    w = _worker({**spec, "state": "draining"})
    never = reasons_never(spec_job, w)
    assert len(never) == 1
    assert reasons_now(spec_job, w) == ["worker is draining", *never]


def test_reasons_follow_the_chain_order() -> None:
    spec_job = job(accelerator="cuda", cpu_cores=64, os=["darwin"], python=">=3.13")
    reasons = reasons_never(spec_job, worker("w1"))
    assert [r.split(" ")[1] for r in reasons] == ["a", "64", "os", "python"]


def test_a_gpu_job_on_a_cpu_worker_gets_one_reason() -> None:
    reasons = reasons_never(job(accelerator="cuda", gpu_count=2, gpu_memory_gb=40), worker("w1"))
    assert reasons == ["needs a cuda accelerator, has cpu"]


def test_a_new_check_plugs_into_the_chain() -> None:
    @check("spot", "static")
    def no_spot(job_spec: Any, w: Any) -> str | None:
        return "spot workers take no jobs labelled critical" if w.capabilities.zone else None

    chain = [*CHECKS, no_spot]
    spot = worker("w1", cuda_caps(zone="us-east-1a"))
    assert reasons_never(job(), spot, chain) == ["spot workers take no jobs labelled critical"]
    assert reasons_never(job(), spot) == []


def test_devices_without_memory_or_capability_do_not_meet_those_fields() -> None:
    unknown = caps(accelerator="cuda", gpus=(("Mystery", None, None),), memory_kind=None)
    w = worker("w1", unknown)
    assert f.gpu_memory_gb(job(accelerator="cuda", gpu_memory_gb=1), w) is not None
    assert (
        f.min_cuda_compute_capability(job(accelerator="cuda", min_cuda_compute_capability="5.0"), w)
        is not None
    )
    assert f.gpu_memory_kind(job(accelerator="cuda", gpu_memory_kind="dedicated"), w) is not None
    assert reasons_never(job(accelerator="cuda"), w) == []
