"""Properties: valid specs survive a dump/validate round trip; junk raises only ValidationError."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gpulayer.spec import PROFILES, JobSpec

names = st.from_regex(r"[A-Za-z0-9_.-]{1,63}", fullmatch=True)
env_names = st.from_regex(r"[A-Z][A-Z0-9_]{0,10}", fullmatch=True).filter(
    lambda n: (
        not n.startswith(("GPULAYER_", "TORCHELASTIC_"))
        and n not in {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "ROLE_NAME"}
        and n not in {"GROUP_RANK", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_RANK"}
        and n != "ROLE_WORLD_SIZE"
    )
)
json_scalars = st.none() | st.booleans() | st.integers(-(2**31), 2**31) | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
rel_paths = st.lists(st.from_regex(r"[a-z0-9_]{1,6}", fullmatch=True), min_size=1, max_size=3).map(
    "/".join
)

command = st.fixed_dictionaries(
    {"kind": st.just("command"), "command": st.lists(st.text(min_size=1, max_size=8), min_size=1)}
)
function = st.fixed_dictionaries(
    {"kind": st.just("function"), "entrypoint": st.just("pkg.mod:fn")},
    optional={
        "args": st.lists(json_values, max_size=3),
        "kwargs": st.dictionaries(st.text(max_size=4), json_values, max_size=3),
    },
)
distributed = st.fixed_dictionaries(
    {
        "kind": st.just("distributed"),
        "entrypoint": rel_paths.map(lambda p: p + ".py"),
        "num_workers": st.integers(1, 8),
        "procs_per_worker": st.integers(1, 8),
    },
    optional={"rendezvous": st.fixed_dictionaries({"port": st.integers(1, 65535)})},
)


@st.composite
def resources(draw: st.DrawFn) -> dict[str, Any]:
    profile = draw(st.none() | st.sampled_from(sorted(PROFILES)))
    data: dict[str, Any] = {}
    if profile:
        data["profile"] = profile
        accelerator = PROFILES[profile].accelerator
    else:
        accelerator = draw(st.sampled_from(["cpu", "cuda", "mps", "rocm"]))
        data["accelerator"] = accelerator
    if accelerator != "cpu":
        data["gpu_count"] = draw(st.integers(1, 8))
        if draw(st.booleans()):
            data["gpu_memory_gb"] = draw(st.floats(1, 200))
    if accelerator == "cuda" and draw(st.booleans()):
        data["min_cuda_compute_capability"] = (
            f"{draw(st.integers(3, 10))}.{draw(st.integers(0, 9))}"
        )
    if draw(st.booleans()):
        data["frameworks"] = {"numpy": draw(st.sampled_from(["", ">=1.20", "~=2.0", "==1.26.*"]))}
    data["cpu_cores"] = draw(st.floats(0.1, 256))
    data["os"] = draw(st.lists(st.sampled_from(["linux", "darwin", "windows"]), max_size=2))
    data["cpu_arch"] = draw(st.lists(st.sampled_from(["x86_64", "arm64", "amd64"]), max_size=2))
    return data


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    workload = draw(st.one_of(command, function, distributed))
    data: dict[str, Any] = {
        "name": draw(names),
        "workload": workload,
        "resources": draw(resources()),
    }
    if workload["kind"] == "distributed" and data["resources"].get("accelerator", "") != "cuda":
        workload["comm_backend"] = "gloo"
    targets = draw(st.permutations(["local", "remote", "cloud"]))
    data["placement"] = {
        "target": targets[0],
        "fallback_targets": targets[1 : 1 + draw(st.integers(0, 2))],
        "strategy": draw(st.sampled_from(["spread", "first_fit", "most_free_memory"])),
        "max_hourly_cost": draw(st.none() | st.floats(0, 100)),
    }
    data["env"] = draw(st.dictionaries(env_names, st.text(max_size=10), max_size=3))
    secret_names = draw(st.lists(env_names, max_size=2, unique=True))
    data["secrets"] = [{"name": n} for n in secret_names if n not in data["env"]]
    paths = draw(st.lists(rel_paths, max_size=3, unique=True))
    data["inputs"] = [{"artifact": f"/data/{i}", "path": p} for i, p in enumerate(paths)]
    data["timeout_seconds"] = draw(st.none() | st.floats(0.001, 1e6))
    if workload["kind"] != "distributed":
        data["retry"] = {"max_attempts": draw(st.integers(1, 5))}
    data["labels"] = draw(st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3))
    return data


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_valid_specs_round_trip(data: dict[str, Any]) -> None:
    spec = JobSpec.model_validate(data)
    dumped = spec.model_dump(mode="json")
    again = JobSpec.model_validate(json.loads(json.dumps(dumped)))
    assert again.model_dump(mode="json") == dumped


fuzz_json = st.recursive(
    json_scalars | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "name",
                    "workload",
                    "kind",
                    "command",
                    "resources",
                    "placement",
                    "env",
                    "secrets",
                    "inputs",
                    "retry",
                    "gpu_count",
                    "accelerator",
                    "profile",
                    "entrypoint",
                    "function",
                    "target",
                    "path",
                    "artifact",
                    "x",
                ]
            )
            | st.text(max_size=5),
            inner,
            max_size=5,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(fuzz_json)
def test_fuzzed_json_raises_only_validation_error(data: Any) -> None:
    with contextlib.suppress(ValidationError):
        JobSpec.model_validate(data)


@settings(max_examples=100, deadline=None)
@given(
    specs(),
    st.sampled_from(["workload", "resources", "placement", "retry"]),
    st.text(min_size=1, max_size=6),
)
def test_unknown_field_anywhere_is_rejected(data: dict[str, Any], section: str, key: str) -> None:
    section_data = data.setdefault(section, {"max_attempts": 1} if section == "retry" else {})
    if key in section_data or key in {"kind"}:
        return
    section_data[key] = 1
    try:
        JobSpec.model_validate(data)
    except ValidationError as exc:
        assert any(e["type"] == "extra_forbidden" or e["loc"][-1] == key for e in exc.errors())
    else:
        raise AssertionError(f"{section}.{key} was accepted")
