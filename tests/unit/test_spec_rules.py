"""Each JobSpec rule, accepted and rejected, with the field path the error names."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from gpulayer.errors import SpecError
from gpulayer.spec import JobSpec
from gpulayer.spec.validate import validate_spec

BASE: dict[str, Any] = {"workload": {"kind": "command", "command": ["python", "train.py"]}}


def spec_with(path: str, value: Any, base: dict[str, Any] | None = None) -> dict[str, Any]:
    data = copy.deepcopy(base or BASE)
    node = data
    *parents, last = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return data


FUNC = {"workload": {"kind": "function", "entrypoint": "pkg.mod:run"}}
DIST = {"workload": {"kind": "distributed", "entrypoint": "train.py"}}

ACCEPTED = [
    ("name default", BASE),
    ("name 63 chars", spec_with("name", "a" * 63)),
    ("name with _.-", spec_with("name", "my_job.v2-final")),
    ("api_version", spec_with("api_version", "gpulayer.dev/v1alpha1")),
    ("function entrypoint", FUNC),
    ("function args kwargs", spec_with("workload.args", [1, "a", {"b": [None]}], FUNC)),
    ("nested function entrypoint", spec_with("workload.entrypoint", "a.b:C.method", FUNC)),
    ("distributed script", DIST),
    ("distributed function", {"workload": {"kind": "distributed", "function": "m:f"}}),
    ("ports", {"workload": {"kind": "command", "command": ["true"]}, "ports": [6006, 8888]}),
    (
        "distributed command",
        {"workload": {"kind": "distributed", "command": ["sh", "run.sh"], "num_workers": 2}},
    ),
    ("distributed sizes", spec_with("workload.num_workers", 4, DIST)),
    ("rendezvous port", spec_with("workload.rendezvous", {"port": 65535}, DIST)),
    ("cuda gpus", spec_with("resources", {"accelerator": "cuda", "gpu_count": 8})),
    ("gpu memory", spec_with("resources", {"accelerator": "cuda", "gpu_memory_gb": 40})),
    (
        "unified memory",
        spec_with("resources", {"accelerator": "mps", "gpu_memory_kind": "unified"}),
    ),
    (
        "capability",
        spec_with("resources", {"accelerator": "cuda", "min_cuda_compute_capability": "8.0"}),
    ),
    ("cpu fraction", spec_with("resources.cpu_cores", 0.5)),
    ("memory disk", spec_with("resources", {"memory_gb": 16, "disk_gb": 100})),
    ("os arch", spec_with("resources", {"os": ["linux"], "cpu_arch": ["x86_64", "aarch64"]})),
    ("frameworks", spec_with("resources.frameworks", {"torch": ">=2.2,<3", "numpy": ""})),
    ("python", spec_with("resources.python", ">=3.10")),
    ("each profile", spec_with("resources.profile", "jax-cuda")),
    (
        "profile + matching accelerator",
        spec_with("resources", {"profile": "mlx", "accelerator": "mps"}),
    ),
    (
        "targets",
        spec_with("placement", {"target": "remote", "fallback_targets": ["cloud", "local"]}),
    ),
    ("strategy", spec_with("placement.strategy", "most_free_memory")),
    ("on_unschedulable", spec_with("placement.on_unschedulable", "fail")),
    ("cost cap zero", spec_with("placement.max_hourly_cost", 0)),
    ("currency", spec_with("placement.currency", "EUR")),
    ("provisioning", spec_with("placement.provisioning", {"provider": "aws", "release": "r1"})),
    ("env", spec_with("env", {"EPOCHS": "10", "_X": ""})),
    ("secret short", spec_with("secrets", [{"name": "HF_TOKEN"}])),
    ("secret key", spec_with("secrets", [{"name": "TOKEN", "source": "env", "key": "MY_TOKEN"}])),
    ("inputs", spec_with("inputs", [{"artifact": "/data/x.csv", "path": "data/x.csv"}])),
    ("timeout", spec_with("timeout_seconds", 0.5)),
    ("retry", spec_with("retry", {"max_attempts": 3, "retry_on": ["worker_lost", "preempted"]})),
    ("labels", spec_with("labels", {"team": "nlp"})),
    # Each numeric bound, at the bound (docs/jobspec-readings.md lists them).
    ("retry at most", spec_with("retry.max_attempts", 100)),
    ("timeout 30 days", spec_with("timeout_seconds", 2592000)),
    ("port 1", spec_with("workload.rendezvous", {"port": 1}, DIST)),
    ("join timeout 30 days", spec_with("workload.rendezvous.join_timeout_seconds", 2592000, DIST)),
    (
        "provisioning 30 days",
        spec_with("placement.provisioning", {"provisioning_timeout_seconds": 2592000}),
    ),
    ("setup timeout 1 day", spec_with("setup", {"timeout_seconds": 86400})),
    (
        "dist largest",
        spec_with("workload.procs_per_worker", 1024, spec_with("workload.num_workers", 1024, DIST)),
    ),
    ("gpus at most", spec_with("resources", {"accelerator": "cuda", "gpu_count": 64})),
    (
        "gpu memory at most",
        spec_with("resources", {"accelerator": "cuda", "gpu_memory_gb": 1024}),
    ),
    (
        "machine at most",
        spec_with("resources", {"cpu_cores": 4096, "memory_gb": 65536, "disk_gb": 1048576}),
    ),
    ("cost cap at most", spec_with("placement.max_hourly_cost", 1000000)),
]


@pytest.mark.parametrize(("case", "data"), ACCEPTED, ids=[c for c, _ in ACCEPTED])
def test_accepted(case: str, data: dict[str, Any]) -> None:
    spec = JobSpec.model_validate(data)
    again = JobSpec.model_validate(spec.model_dump(mode="json"))
    assert again == spec


REJECTED = [
    ("unknown top field", spec_with("gpus", 1), "gpus: unknown field"),
    ("unknown nested field", spec_with("resources.gpus", 1), "resources.gpus: unknown field"),
    ("unknown workload field", spec_with("workload.shell", True), "workload.shell: unknown field"),
    ("unknown placement field", spec_with("placement.zone", "a"), "placement.zone: unknown field"),
    ("workload missing", {}, "workload: required field is missing"),
    ("bad kind", {"workload": {"kind": "shell"}}, "workload: unknown kind"),
    ("api_version", spec_with("api_version", "v2"), "api_version:"),
    ("name too long", spec_with("name", "a" * 64), "name:"),
    ("name empty", spec_with("name", ""), "name:"),
    ("name space", spec_with("name", "a b"), "name:"),
    ("name slash", spec_with("name", "a/b"), "name:"),
    ("empty command", spec_with("workload.command", []), "workload.command:"),
    ("empty program", spec_with("workload.command", [""]), "workload.command:"),
    ("command not list", spec_with("workload.command", "python x.py"), "workload.command:"),
    ("bad entrypoint", spec_with("workload.entrypoint", "mod.func", FUNC), "workload.entrypoint:"),
    ("entrypoint empty fn", spec_with("workload.entrypoint", "mod:", FUNC), "workload.entrypoint:"),
    ("kwargs not json", spec_with("workload.kwargs", [1], FUNC), "workload.kwargs:"),
    ("dist neither", {"workload": {"kind": "distributed"}}, "workload.entrypoint:"),
    (
        "dist both",
        {"workload": {"kind": "distributed", "entrypoint": "a.py", "function": "m:f"}},
        "workload.entrypoint:",
    ),
    ("port zero", spec_with("ports", [0]), "ports.0:"),
    ("port too big", spec_with("ports", [65536]), "ports.0:"),
    ("port text", spec_with("ports", ["6006"]), "ports.0:"),
    ("too many ports", spec_with("ports", list(range(1, 18))), "ports:"),
    (
        "dist script and command",
        {"workload": {"kind": "distributed", "entrypoint": "a.py", "command": ["sh"]}},
        "workload.entrypoint:",
    ),
    (
        "dist command args",
        {"workload": {"kind": "distributed", "command": ["sh"], "args": ["x"]}},
        "workload.args:",
    ),
    (
        "dist command function args",
        {"workload": {"kind": "distributed", "command": ["sh"], "function_args": [1]}},
        "workload.function_args:",
    ),
    (
        "dist command empty",
        {"workload": {"kind": "distributed", "command": []}},
        "workload.command:",
    ),
    (
        "dist command empty program",
        {"workload": {"kind": "distributed", "command": [""]}},
        "workload.command:",
    ),
    (
        "dist bad function",
        {"workload": {"kind": "distributed", "function": "m"}},
        "workload.function:",
    ),
    ("dist abs script", spec_with("workload.entrypoint", "/abs.py", DIST), "workload.entrypoint:"),
    ("dist workers 0", spec_with("workload.num_workers", 0, DIST), "workload.num_workers:"),
    ("dist procs 0", spec_with("workload.procs_per_worker", 0, DIST), "workload.procs_per_worker:"),
    ("dist backend", spec_with("workload.comm_backend", "mpi", DIST), "workload.comm_backend:"),
    (
        "nccl on cpu",
        spec_with("workload.comm_backend", "nccl", DIST),
        "workload.comm_backend: nccl needs accelerator cuda",
    ),
    ("port 0", spec_with("workload.rendezvous", {"port": 0}, DIST), "workload.rendezvous.port:"),
    (
        "port high",
        spec_with("workload.rendezvous", {"port": 65536}, DIST),
        "workload.rendezvous.port:",
    ),
    (
        "join timeout",
        spec_with("workload.rendezvous", {"join_timeout_seconds": 0}, DIST),
        "workload.rendezvous.join_timeout_seconds:",
    ),
    ("dist retry", spec_with("retry", {"max_attempts": 2}, DIST), "retry:"),
    ("accelerator", spec_with("resources.accelerator", "tpu"), "resources.accelerator:"),
    ("cpu with gpus", spec_with("resources.gpu_count", 1), "resources.gpu_count:"),
    (
        "cuda zero gpus",
        spec_with("resources", {"accelerator": "cuda", "gpu_count": 0}),
        "resources.gpu_count:",
    ),
    ("negative gpus", spec_with("resources.gpu_count", -1), "resources.gpu_count:"),
    (
        "gpu memory 0",
        spec_with("resources", {"accelerator": "cuda", "gpu_memory_gb": 0}),
        "resources.gpu_memory_gb:",
    ),
    ("gpu memory on cpu", spec_with("resources.gpu_memory_gb", 8), "resources.gpu_memory_gb:"),
    (
        "memory kind",
        spec_with("resources", {"accelerator": "cuda", "gpu_memory_kind": "shared"}),
        "resources.gpu_memory_kind:",
    ),
    (
        "capability form",
        spec_with("resources", {"accelerator": "cuda", "min_cuda_compute_capability": "8"}),
        "resources.min_cuda_compute_capability:",
    ),
    (
        "capability on cpu",
        spec_with("resources.min_cuda_compute_capability", "8.0"),
        "resources.min_cuda_compute_capability:",
    ),
    ("cpu cores 0", spec_with("resources.cpu_cores", 0), "resources.cpu_cores:"),
    ("memory 0", spec_with("resources.memory_gb", 0), "resources.memory_gb:"),
    ("disk negative", spec_with("resources.disk_gb", -5), "resources.disk_gb:"),
    ("os", spec_with("resources.os", ["beos"]), "resources.os:"),
    ("arch", spec_with("resources.cpu_arch", ["sparc"]), "resources.cpu_arch:"),
    ("framework spec", spec_with("resources.frameworks", {"torch": "2.2"}), "resources.frameworks"),
    (
        "framework name",
        spec_with("resources.frameworks", {"to rch": ">=1"}),
        "resources.frameworks:",
    ),
    ("python spec", spec_with("resources.python", "three"), "resources.python:"),
    ("profile unknown", spec_with("resources.profile", "tf-gpu"), "resources.profile:"),
    (
        "profile mismatch",
        spec_with("resources", {"profile": "pytorch-cuda", "accelerator": "cpu"}),
        "resources.accelerator: 'cpu' does not match profile",
    ),
    ("target", spec_with("placement.target", "edge"), "placement.target:"),
    (
        "fallback",
        spec_with("placement.fallback_targets", ["moon"]),
        "placement.fallback_targets.0:",
    ),
    (
        "fallback dup",
        spec_with("placement.fallback_targets", ["local"]),
        "placement.fallback_targets:",
    ),
    ("strategy", spec_with("placement.strategy", "random"), "placement.strategy:"),
    (
        "on_unschedulable",
        spec_with("placement.on_unschedulable", "wait"),
        "placement.on_unschedulable:",
    ),
    ("cost negative", spec_with("placement.max_hourly_cost", -1), "placement.max_hourly_cost:"),
    ("currency", spec_with("placement.currency", "usd"), "placement.currency:"),
    ("currency unknown", spec_with("placement.currency", "ABC"), "placement.currency:"),
    (
        "provisioning timeout",
        spec_with("placement.provisioning", {"provisioning_timeout_seconds": 0}),
        "placement.provisioning.provisioning_timeout_seconds:",
    ),
    ("env int", spec_with("env", {"A": 1}), "env.A:"),
    ("env reserved prefix", spec_with("env", {"GPULAYER_X": "1"}), "env:"),
    ("env torchrun name", spec_with("env", {"RANK": "0"}), "env:"),
    ("env torchelastic", spec_with("env", {"TORCHELASTIC_RUN_ID": "x"}), "env:"),
    ("env bad name", spec_with("env", {"1A": "x"}), "env:"),
    ("secret no name", spec_with("secrets", [{"key": "X"}]), "secrets.0.name:"),
    (
        "secret source",
        spec_with("secrets", [{"name": "A", "source": "vault"}]),
        "secrets.0.source:",
    ),
    ("secret reserved", spec_with("secrets", [{"name": "WORLD_SIZE"}]), "secrets.0.name:"),
    ("secret twice", spec_with("secrets", [{"name": "A"}, {"name": "A"}]), "secrets:"),
    (
        "secret and env",
        {**spec_with("secrets", [{"name": "A"}]), "env": {"A": "1"}},
        "env: 'A' is also a secret",
    ),
    (
        "input abs",
        spec_with("inputs", [{"artifact": "x", "path": "/etc/passwd"}]),
        "inputs.0.path:",
    ),
    (
        "input dotdot",
        spec_with("inputs", [{"artifact": "x", "path": "a/../../b"}]),
        "inputs.0.path:",
    ),
    ("input empty", spec_with("inputs", [{"artifact": "x", "path": ""}]), "inputs.0.path:"),
    ("input dot", spec_with("inputs", [{"artifact": "x", "path": "."}]), "inputs.0.path:"),
    (
        "input windows abs",
        spec_with("inputs", [{"artifact": "x", "path": "C:\\x"}]),
        "inputs.0.path:",
    ),
    (
        "input no artifact",
        spec_with("inputs", [{"artifact": "", "path": "a"}]),
        "inputs.0.artifact:",
    ),
    (
        "input path twice",
        spec_with("inputs", [{"artifact": "x", "path": "a"}, {"artifact": "y", "path": "a"}]),
        "inputs:",
    ),
    ("timeout 0", spec_with("timeout_seconds", 0), "timeout_seconds:"),
    ("timeout text", spec_with("timeout_seconds", "soon"), "timeout_seconds:"),
    ("retry 0", spec_with("retry", {"max_attempts": 0}), "retry.max_attempts:"),
    ("retry event", spec_with("retry", {"retry_on": ["oom"]}), "retry.retry_on.0:"),
    ("labels value", spec_with("labels", {"a": 1}), "labels.a:"),
    # Numbers past their bound name the field and the bound, whatever their size.
    (
        "retry huge",
        spec_with("retry.max_attempts", 10**30),
        "retry.max_attempts: Input should be less than or equal to 100",
    ),
    ("retry 101", spec_with("retry.max_attempts", 101), "retry.max_attempts:"),
    (
        "timeout past 30 days",
        spec_with("timeout_seconds", 2592001),
        "timeout_seconds: Input should be less than or equal to 2592000",
    ),
    ("timeout huge", spec_with("timeout_seconds", 1e300), "timeout_seconds:"),
    (
        "join timeout past 30 days",
        spec_with("workload.rendezvous.join_timeout_seconds", 2592001, DIST),
        "workload.rendezvous.join_timeout_seconds:",
    ),
    (
        "provisioning past 30 days",
        spec_with("placement.provisioning", {"provisioning_timeout_seconds": 2592001}),
        "placement.provisioning.provisioning_timeout_seconds:",
    ),
    ("setup past 1 day", spec_with("setup", {"timeout_seconds": 86401}), "setup.timeout_seconds:"),
    ("grace past 1 hour", spec_with("grace_seconds", 3601), "grace_seconds:"),
    ("workers past", spec_with("workload.num_workers", 1025, DIST), "workload.num_workers:"),
    (
        "procs past",
        spec_with("workload.procs_per_worker", 1025, DIST),
        "workload.procs_per_worker:",
    ),
    (
        "gpus past",
        spec_with("resources", {"accelerator": "cuda", "gpu_count": 65}),
        "resources.gpu_count:",
    ),
    (
        "gpu memory past",
        spec_with("resources", {"accelerator": "cuda", "gpu_memory_gb": 1025}),
        "resources.gpu_memory_gb:",
    ),
    ("cpu cores past", spec_with("resources.cpu_cores", 4097), "resources.cpu_cores:"),
    ("memory past", spec_with("resources.memory_gb", 65537), "resources.memory_gb:"),
    ("disk past", spec_with("resources.disk_gb", 1048577), "resources.disk_gb:"),
    (
        "cost cap past",
        spec_with("placement.max_hourly_cost", 1000001),
        "placement.max_hourly_cost:",
    ),
]


@pytest.mark.parametrize(("case", "data", "expected"), REJECTED, ids=[c for c, _, _ in REJECTED])
def test_rejected(case: str, data: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValidationError):
        JobSpec.model_validate(data)
    with pytest.raises(SpecError) as caught:
        validate_spec(data)
    assert any(line.startswith(expected) for line in caught.value.lines), caught.value.lines


def test_defaults_are_filled() -> None:
    dumped = JobSpec.model_validate(BASE).model_dump(mode="json")
    assert dumped["name"] == "job"
    assert dumped["api_version"] == "gpulayer.dev/v1alpha1"
    assert dumped["resources"]["accelerator"] == "cpu"
    assert dumped["resources"]["gpu_count"] == 0
    assert dumped["resources"]["cpu_cores"] == 1
    assert dumped["placement"]["target"] == "local"
    assert dumped["placement"]["strategy"] == "spread"
    assert dumped["placement"]["on_unschedulable"] == "queue"
    assert dumped["placement"]["currency"] == "USD"
    assert dumped["retry"] == {"max_attempts": 1, "retry_on": ["worker_lost"]}
    assert dumped["workload"]["source"] is None
    assert dumped["env"] == {} and dumped["secrets"] == [] and dumped["inputs"] == []


@pytest.mark.parametrize("accelerator", ["cuda", "mps", "rocm"])
def test_gpu_accelerators_default_to_one_gpu(accelerator: str) -> None:
    spec = JobSpec.model_validate(spec_with("resources.accelerator", accelerator))
    assert spec.resources.gpu_count == 1


def test_secret_key_defaults_to_name() -> None:
    spec = JobSpec.model_validate(spec_with("secrets", [{"name": "HF_TOKEN"}]))
    assert spec.secrets[0].key == "HF_TOKEN" and spec.secrets[0].source == "env"


@pytest.mark.parametrize(
    ("accelerator", "backend"), [("cpu", "gloo"), ("cuda", "nccl"), ("mps", "gloo")]
)
def test_distributed_backend_default(accelerator: str, backend: str) -> None:
    data = spec_with("resources.accelerator", accelerator, DIST)
    spec = JobSpec.model_validate(data)
    dumped = spec.model_dump(mode="json")
    assert dumped["workload"]["comm_backend"] == backend
    assert dumped["workload"]["rendezvous"] == {"port": 29500, "join_timeout_seconds": 300}
    assert dumped["workload"]["num_workers"] == 1 and dumped["workload"]["procs_per_worker"] == 1
    assert dumped["retry"] == {"max_attempts": 1, "retry_on": []}


def test_cpu_arch_aliases_normalize() -> None:
    spec = JobSpec.model_validate(spec_with("resources.cpu_arch", ["amd64", "arm64", "x86_64"]))
    assert spec.resources.cpu_arch == ["x86_64", "aarch64"]
