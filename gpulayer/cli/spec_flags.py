"""Turn `gpulayer submit` flags into JobSpec data. Pure: flags override the file's fields."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpulayer.errors import UsageError


@dataclass
class SubmitFlags:
    argv: list[str] = field(default_factory=list)
    name: str | None = None
    profile: str | None = None
    target: str | None = None
    fallback: list[str] = field(default_factory=list)
    accelerator: str | None = None
    gpus: int | None = None
    gpu_models: list[str] = field(default_factory=list)
    gpu_slices: bool = False
    env: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    timeout: float | None = None
    max_hourly_cost: float | None = None
    worker_labels: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    providers: list[str] = field(default_factory=list)
    regions: list[str] = field(default_factory=list)
    nodes: int | None = None


def parse_pairs(values: list[str], flag: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        key, sep, item = value.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag}: expected KEY=VALUE, got {value!r}")
        pairs[key] = item
    return pairs


def parse_secret(value: str) -> dict[str, str]:
    name, sep, key = value.partition("=")
    if not name or (sep and not key):
        raise UsageError(f"--secret: expected NAME or NAME=KEY, got {value!r}")
    return {"name": name, "source": "env", "key": key or name}


def parse_input(value: str) -> dict[str, str]:
    # The artifact may hold colons itself (s3://..., job:<id>/...); the path never does.
    artifact, sep, path = value.rpartition(":")
    if not sep or not artifact or not path or path.startswith("//"):
        raise UsageError(f"--input: expected ARTIFACT:PATH, got {value!r}")
    return {"artifact": artifact, "path": path}


def apply_flags(base: dict[str, Any] | None, flags: SubmitFlags) -> dict[str, Any]:
    data = copy.deepcopy(base) if base else {}
    if flags.nodes is not None and flags.nodes < 1:
        raise UsageError(f"--nodes: expected a count of 1 or more, got {flags.nodes}")
    if flags.argv and flags.nodes is not None:
        # SkyPilot's num_nodes with run:, dstack's nodes with commands: once on every node.
        data["workload"] = {
            "kind": "distributed",
            "command": list(flags.argv),
            "num_workers": flags.nodes,
        }
    elif flags.argv:
        data["workload"] = {"kind": "command", "command": list(flags.argv)}
    elif "workload" not in data:
        raise UsageError("ARGV: give a command after -- (or a job file with -f)")
    elif flags.nodes is not None:
        if data["workload"].get("kind") != "distributed":
            raise UsageError("--nodes: the job file's workload is not distributed; give a command")
        data["workload"]["num_workers"] = flags.nodes
    if flags.name is not None:
        data["name"] = flags.name

    resources = _section(data, "resources")
    if flags.profile is not None:
        resources["profile"] = flags.profile
        if flags.accelerator is None and "accelerator" in resources:
            del resources["accelerator"]  # let the profile choose, rather than clash with the file
    if flags.accelerator is not None:
        resources["accelerator"] = flags.accelerator
    if flags.gpus is not None:
        resources["gpu_count"] = flags.gpus
        if flags.gpus and "accelerator" not in resources and "profile" not in resources:
            resources["accelerator"] = "cuda"  # as --gpu MODEL: GPUs asked for are CUDA's
    if flags.gpu_models:
        resources["gpu_models"] = list(flags.gpu_models)
        if "accelerator" not in resources and "profile" not in resources:
            resources["accelerator"] = "cuda"  # a GPU model named is a CUDA GPU unless told
    if flags.gpu_slices:
        resources["gpu_slices"] = True
        if "accelerator" not in resources and "profile" not in resources:
            resources["accelerator"] = "cuda"

    placement = _section(data, "placement")
    if flags.target is not None:
        placement["target"] = flags.target
    if flags.fallback:
        placement["fallback_targets"] = list(flags.fallback)
    if flags.max_hourly_cost is not None:
        placement["max_hourly_cost"] = flags.max_hourly_cost
    if flags.worker_labels:
        placement["worker_labels"] = {
            **placement.get("worker_labels", {}),
            **parse_pairs(flags.worker_labels, "--worker-label"),
        }
    if flags.providers:
        placement["providers"] = list(flags.providers)
    if flags.regions:
        placement["regions"] = list(flags.regions)

    if flags.env:
        data["env"] = {**data.get("env", {}), **parse_pairs(flags.env, "--env")}
    if flags.labels:
        data["labels"] = {**data.get("labels", {}), **parse_pairs(flags.labels, "--label")}
    if flags.secrets:
        data["secrets"] = _replace_by(
            data.get("secrets", []), map(parse_secret, flags.secrets), "name"
        )
    if flags.inputs:
        data["inputs"] = _replace_by(data.get("inputs", []), map(parse_input, flags.inputs), "path")
    if flags.timeout is not None:
        data["timeout_seconds"] = flags.timeout
    for section in ("resources", "placement"):
        if not data[section]:
            del data[section]
    return data


def _replace_by(existing: list[Any], given: Iterable[dict[str, str]], key: str) -> list[Any]:
    """The file's entries, less those a flag gives again (same key), then the flags' entries."""
    added = list(given)
    replaced = {entry[key] for entry in added}
    kept = [e for e in existing if not isinstance(e, dict) or e.get(key) not in replaced]
    return kept + added


def _section(data: dict[str, Any], name: str) -> dict[str, Any]:
    section = data.get(name)
    if section is None:
        section = data[name] = {}
    if not isinstance(section, dict):
        raise UsageError(f"{name}: must be an object")
    return section


# Each flag and the spec field it writes: a refusal of that field is told under the flag the
# user typed (`--gpus: ...`, not `resources.gpu_count: ...`).
_FLAG_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("name", "--name", "name"),
    ("profile", "--profile", "resources.profile"),
    ("accelerator", "--accelerator", "resources.accelerator"),
    ("gpus", "--gpus", "resources.gpu_count"),
    ("gpu_models", "--gpu", "resources.gpu_models"),
    ("gpu_slices", "--gpu-slices", "resources.gpu_slices"),
    ("target", "--target", "placement.target"),
    ("fallback", "--fallback", "placement.fallback_targets"),
    ("max_hourly_cost", "--max-hourly-cost", "placement.max_hourly_cost"),
    ("worker_labels", "--worker-label", "placement.worker_labels"),
    ("providers", "--provider", "placement.providers"),
    ("regions", "--region", "placement.regions"),
    ("env", "--env", "env"),
    ("labels", "--label", "labels"),
    ("secrets", "--secret", "secrets"),
    ("inputs", "--input", "inputs"),
    ("timeout", "--timeout", "timeout_seconds"),
    ("nodes", "--nodes", "workload.num_workers"),
)


_ITEM_INDEX = re.compile(r"^\.[0-9]+(?=[:.])")


def name_flags(lines: Iterable[str], flags: SubmitFlags, *, under: str = "") -> list[str]:
    """Refusal lines with each field a given flag set named by that flag; ``under`` is where
    the job sits in the document refused (``job.`` in a schedule)."""
    given = [
        (flag, under + path)
        for attribute, flag, path in _FLAG_FIELDS
        if getattr(flags, attribute) not in (None, [], False)
    ]
    named = []
    for line in lines:
        for flag, path in given:
            if line.startswith(f"{path}:") or line.startswith(f"{path}."):
                rest = line[len(path) :]
                # A repeated flag's item is named by its value in the message, not its index;
                # a KEY=VALUE flag's by its key (`--label team: ...`).
                rest = _ITEM_INDEX.sub("", rest, count=1)
                line = flag + (" " + rest[1:] if rest.startswith(".") else rest)
                break
        named.append(line)
    return named
