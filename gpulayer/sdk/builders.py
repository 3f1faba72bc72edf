"""Builders that produce JobSpecs: `gl.command([...])`, `gl.function("mod:fn", ...)`, ...

Each builder method returns the builder, so a job reads as one chain:

    gl.command(["python", "train.py"]).resources(profile="pytorch-cuda", gpus=2).placement(
        target="remote"
    )
"""

from __future__ import annotations

import copy
import json
from typing import Any

from gpulayer.errors import UsageError

# Short keyword names the SDK accepts, and the spec field each one sets.
RESOURCE_ALIASES = {
    "gpus": "gpu_count",
    "gpu_memory": "gpu_memory_gb",
    "memory": "memory_gb",
    "disk": "disk_gb",
}
PLACEMENT_KEYS = frozenset(
    {
        "target",
        "fallback_targets",
        "worker_ids",
        "worker_labels",
        "providers",
        "regions",
        "strategy",
        "on_unschedulable",
        "max_hourly_cost",
        "currency",
        "provisioning",
    }
)
RESOURCE_KEYS = frozenset(
    {
        "profile",
        "accelerator",
        "gpu_count",
        "gpu_memory_gb",
        "gpu_memory_kind",
        "min_cuda_compute_capability",
        "cpu_cores",
        "memory_gb",
        "disk_gb",
        "os",
        "cpu_arch",
        "frameworks",
        "python",
    }
)
TOP_KEYS = frozenset(
    {
        "name",
        "env",
        "secrets",
        "inputs",
        "timeout_seconds",
        "grace_seconds",
        "retry",
        "labels",
        "setup",
    }
)


def ensure_json(value: Any, what: str) -> Any:
    """Arguments and results travel as JSON; anything else is an error at call time."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{what}: not JSON-serializable ({exc})") from None
    return value


class JobBuilder:
    def __init__(self, workload: dict[str, Any]) -> None:
        self._data: dict[str, Any] = {"workload": workload}

    def name(self, name: str) -> JobBuilder:
        self._data["name"] = name
        return self

    def source(self, directory: str) -> JobBuilder:
        self._data["workload"]["source"] = directory
        return self

    def resources(self, **fields: Any) -> JobBuilder:
        section = self._data.setdefault("resources", {})
        for key, value in fields.items():
            spec_key = RESOURCE_ALIASES.get(key, key)
            if spec_key not in RESOURCE_KEYS:
                raise UsageError(f"resources: unknown field {key!r}")
            section[spec_key] = value
        return self

    def placement(self, **fields: Any) -> JobBuilder:
        section = self._data.setdefault("placement", {})
        for key, value in fields.items():
            if key == "fallback":
                key = "fallback_targets"
            if key not in PLACEMENT_KEYS:
                raise UsageError(f"placement: unknown field {key!r}")
            section[key] = list(value) if key == "fallback_targets" else value
        return self

    def env(self, **values: str) -> JobBuilder:
        self._data.setdefault("env", {}).update(values)
        return self

    def secret(self, name: str, key: str | None = None) -> JobBuilder:
        self._data.setdefault("secrets", []).append(
            {"name": name, "source": "env", "key": key or name}
        )
        return self

    def input(self, artifact: str, path: str) -> JobBuilder:
        self._data.setdefault("inputs", []).append({"artifact": artifact, "path": path})
        return self

    def timeout(self, seconds: float) -> JobBuilder:
        self._data["timeout_seconds"] = seconds
        return self

    def grace(self, seconds: float) -> JobBuilder:
        """Seconds between SIGTERM and SIGKILL when a cancel or a timeout ends the job."""
        self._data["grace_seconds"] = seconds
        return self

    def setup(self, **fields: Any) -> JobBuilder:
        """What the job needs installed before it runs: pip=[...], requirements_file=...,
        commands=[[...]], index_url=..., find_links=[...], timeout_seconds=..."""
        self._data.setdefault("setup", {}).update(fields)
        return self

    def retry(self, max_attempts: int, retry_on: list[str] | None = None) -> JobBuilder:
        self._data["retry"] = {
            "max_attempts": max_attempts,
            "retry_on": retry_on or ["worker_lost"],
        }
        return self

    def labels(self, **values: str) -> JobBuilder:
        self._data.setdefault("labels", {}).update(values)
        return self

    def override(self, **overrides: Any) -> JobBuilder:
        """Set fields by their short names: gpus=2, target="cloud", max_hourly_cost=3, name=..."""
        for key, value in overrides.items():
            spec_key = RESOURCE_ALIASES.get(key, key)
            if spec_key in RESOURCE_KEYS:
                self.resources(**{spec_key: value})
            elif key in PLACEMENT_KEYS or key == "fallback":
                self.placement(**{key: value})
            elif key == "timeout":
                self.timeout(value)
            elif key in TOP_KEYS:
                self._data[key] = value
            elif key == "source":
                self.source(value)
            else:
                raise UsageError(f"{key}: not a JobSpec field or SDK option")
        return self

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self._data)

    def spec(self) -> Any:
        """The validated JobSpec (raises SpecError naming each bad field)."""
        from gpulayer.spec.validate import validate_spec

        return validate_spec(self.to_dict())


def command(argv: list[str], **overrides: Any) -> JobBuilder:
    if isinstance(argv, str):
        raise UsageError("command: give the argv as a list, e.g. ['python', 'train.py']")
    return JobBuilder({"kind": "command", "command": list(argv)}).override(**overrides)


def function(entrypoint: str, *args: Any, **kwargs: Any) -> JobBuilder:
    """A function job calling entrypoint ("module:function") with JSON args and kwargs."""
    ensure_json(list(args), "args")
    ensure_json(kwargs, "kwargs")
    return JobBuilder(
        {"kind": "function", "entrypoint": entrypoint, "args": list(args), "kwargs": kwargs}
    )


def distributed(
    entrypoint: str | None = None,
    *,
    function: str | None = None,
    command: list[str] | None = None,
    args: list[str] | None = None,
    num_workers: int = 1,
    procs_per_worker: int = 1,
    **overrides: Any,
) -> JobBuilder:
    """A job on ``num_workers`` nodes: a script run by torchrun (``entrypoint``), a function
    in every rank, or any ``command`` run once per node with the gang's GPULAYER_* variables."""
    workload: dict[str, Any] = {
        "kind": "distributed",
        "num_workers": num_workers,
        "procs_per_worker": procs_per_worker,
    }
    if entrypoint is not None:
        workload["entrypoint"] = entrypoint
        workload["args"] = list(args or [])
    if function is not None:
        workload["function"] = function
    if command is not None:
        workload["command"] = list(command)
    return JobBuilder(workload).override(**overrides)
