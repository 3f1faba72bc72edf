"""The published JSON Schema and `validate` agree on a table of specs.

Each case is a spec and whether it is valid. Where only the validator can tell, the case names
its rule in VALIDATE_ONLY, which says why JSON Schema cannot carry it; the test holds that the
schema accepts such a spec and the validator rejects it, so the list stays true.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gpulayer.errors import SpecError
from gpulayer.spec.schema import jobspec_schema
from gpulayer.spec.validate import validate_spec

VALIDATE_ONLY = {
    "secret-names-unique": "uniqueItems compares whole items; two secrets of one name may "
    "differ in key, and JSON Schema cannot compare one field across items",
    "env-secret-clash": "the names in env and in secrets are data on both sides; JSON Schema "
    "cannot compare the keys of one object with the values of another",
    "input-paths-unique": "uniqueItems compares whole items; two inputs may share a path "
    "with different artifacts",
    "version-specifier": "a PEP 440 specifier set (>=2.1,<3, ~=1.4, ===x) is a grammar with "
    "versions of its own; a regular expression that matches it exactly would be unreadable "
    "and out of step with `packaging`",
    "pep-508-requirement": "a PEP 508 requirement (name, extras, specifiers, a URL, markers) "
    "is a grammar of its own, read by `packaging` as for version specifiers",
}


def _command(**top: Any) -> dict[str, Any]:
    return {"workload": {"kind": "command", "command": ["python", "train.py"]}, **top}


def _resources(**resources: Any) -> dict[str, Any]:
    return _command(resources=resources)


def _distributed(resources: dict[str, Any] | None = None, **workload: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"workload": {"kind": "distributed", **workload}}
    if resources is not None:
        spec["resources"] = resources
    return spec


# (id, spec, valid, rule only validate knows)
CASES: list[tuple[str, dict[str, Any], bool, str | None]] = [
    ("minimal", _command(), True, None),
    ("name-ok", _command(name="fine.tune_01-a"), True, None),
    ("name-space", _command(name="fine tune"), False, None),
    ("name-too-long", _command(name="x" * 64), False, None),
    ("name-empty", _command(name=""), False, None),
    ("unknown-field", _command(nonsense=1), False, None),
    ("program-empty", {"workload": {"kind": "command", "command": ["", "x"]}}, False, None),
    ("command-empty", {"workload": {"kind": "command", "command": []}}, False, None),
    ("kind-unknown", {"workload": {"kind": "shell", "command": ["x"]}}, False, None),
    ("entrypoint-ok", {"workload": {"kind": "function", "entrypoint": "pkg.mod:fn"}}, True, None),
    ("entrypoint-bad", {"workload": {"kind": "function", "entrypoint": "pkg.mod"}}, False, None),
    ("entrypoint-dash", {"workload": {"kind": "function", "entrypoint": "a-b:fn"}}, False, None),
    ("env-ok", _command(env={"EPOCHS": "3", "_X1": "y"}), True, None),
    ("env-name-bad", _command(env={"1BAD": "x"}), False, None),
    ("env-reserved-prefix", _command(env={"GPULAYER_JOB_ID": "x"}), False, None),
    ("env-reserved-torchrun", _command(env={"WORLD_SIZE": "2"}), False, None),
    ("env-value-number", _command(env={"EPOCHS": 3}), False, None),
    ("secret-ok", _command(secrets=[{"name": "HF_TOKEN", "key": "MY_HF"}]), True, None),
    ("secret-reserved", _command(secrets=[{"name": "MASTER_ADDR"}]), False, None),
    (
        "secret-names-unique",
        _command(secrets=[{"name": "A"}, {"name": "A", "key": "B"}]),
        False,
        "secret-names-unique",
    ),
    (
        "env-secret-clash",
        _command(env={"A": "1"}, secrets=[{"name": "A"}]),
        False,
        "env-secret-clash",
    ),
    ("input-ok", _command(inputs=[{"artifact": "data.csv", "path": "data/x.csv"}]), True, None),
    ("input-absolute", _command(inputs=[{"artifact": "a", "path": "/etc/x"}]), False, None),
    ("input-windows-drive", _command(inputs=[{"artifact": "a", "path": "C:x"}]), False, None),
    ("input-dotdot", _command(inputs=[{"artifact": "a", "path": "a/../../x"}]), False, None),
    (
        "input-backslash-dotdot",
        _command(inputs=[{"artifact": "a", "path": "a\\..\\x"}]),
        False,
        None,
    ),
    ("input-dot", _command(inputs=[{"artifact": "a", "path": " . "}]), False, None),
    ("input-nul", _command(inputs=[{"artifact": "a", "path": "a\x00b"}]), False, None),
    (
        "input-paths-unique",
        _command(
            inputs=[{"artifact": "a", "path": "x"}, {"artifact": "b", "path": "x"}],
        ),
        False,
        "input-paths-unique",
    ),
    ("gpu-count-string", _resources(accelerator="cuda", gpu_count="2"), False, None),
    ("gpu-count-float-whole", _resources(accelerator="cuda", gpu_count=2.0), True, None),
    ("gpu-count-fraction", _resources(accelerator="cuda", gpu_count=1.5), False, None),
    ("gpu-count-bool", _resources(accelerator="cuda", gpu_count=True), False, None),
    ("cpu-cores-bool", _resources(cpu_cores=True), False, None),
    ("cpu-cores-string", _resources(cpu_cores="2"), False, None),
    ("cpu-cores-int", _resources(cpu_cores=2), True, None),
    ("memory-zero", _resources(memory_gb=0), False, None),
    ("cpu-with-gpus", _resources(gpu_count=2), False, None),
    ("cpu-with-zero-gpus", _resources(gpu_count=0), True, None),
    ("cpu-with-gpu-memory", _resources(gpu_memory_gb=24), False, None),
    ("cuda-zero-gpus", _resources(accelerator="cuda", gpu_count=0), False, None),
    ("cuda-gpu-slices", _resources(accelerator="cuda", gpu_slices=True), True, None),
    ("cpu-gpu-slices", _resources(gpu_slices=True), False, None),
    ("cpu-no-gpu-slices", _resources(gpu_slices=False), True, None),
    ("gpu-slices-string", _resources(accelerator="cuda", gpu_slices="true"), False, None),
    ("gpu-slices-number", _resources(accelerator="cuda", gpu_slices=1), False, None),
    ("profile-cuda-zero-gpus", _resources(profile="pytorch-cuda", gpu_count=0), False, None),
    ("profile-cuda-gpus", _resources(profile="pytorch-cuda", gpu_count=4), True, None),
    ("profile-cpu-gpus", _resources(profile="pytorch-cpu", gpu_count=1), False, None),
    ("profile-mismatch", _resources(profile="pytorch-cuda", accelerator="mps"), False, None),
    ("profile-match", _resources(profile="mlx", accelerator="mps"), True, None),
    ("profile-unknown", _resources(profile="pytorch-tpu"), False, None),
    (
        "capability-ok",
        _resources(accelerator="cuda", min_cuda_compute_capability="8.0"),
        True,
        None,
    ),
    (
        "capability-form",
        _resources(accelerator="cuda", min_cuda_compute_capability="8"),
        False,
        None,
    ),
    (
        "capability-not-cuda",
        _resources(accelerator="mps", min_cuda_compute_capability="8.0"),
        False,
        None,
    ),
    (
        "capability-profile-cuda",
        _resources(profile="jax-cuda", min_cuda_compute_capability="9.0"),
        True,
        None,
    ),
    ("os-any-case", _resources(os=["Linux", "darwin"]), True, None),
    ("os-unknown", _resources(os=["plan9"]), False, None),
    ("arch-alias", _resources(cpu_arch=["AMD64", "arm64"]), True, None),
    ("arch-unknown", _resources(cpu_arch=["riscv"]), False, None),
    ("framework-key-bad", _resources(frameworks={"torch cuda": ""}), False, None),
    ("framework-marker", _resources(frameworks={"torch.cuda": ""}), True, None),
    ("version-specifier", _resources(frameworks={"torch": "newest"}), False, "version-specifier"),
    ("python-specifier", _resources(python="3.11"), False, "version-specifier"),
    (
        "fallback-ok",
        _command(placement={"target": "remote", "fallback_targets": ["cloud"]}),
        True,
        None,
    ),
    (
        "fallback-repeats-target",
        _command(placement={"target": "cloud", "fallback_targets": ["cloud"]}),
        False,
        None,
    ),
    ("fallback-repeats-default", _command(placement={"fallback_targets": ["local"]}), False, None),
    (
        "fallback-default-elsewhere",
        _command(placement={"fallback_targets": ["remote"]}),
        True,
        None,
    ),
    (
        "fallback-twice",
        _command(placement={"target": "local", "fallback_targets": ["cloud", "cloud"]}),
        False,
        None,
    ),
    ("currency-ok", _command(placement={"max_hourly_cost": 2, "currency": "EUR"}), True, None),
    ("currency-typo", _command(placement={"currency": "EURO"}), False, None),
    ("cost-negative", _command(placement={"max_hourly_cost": -1}), False, None),
    ("timeout-bool", _command(timeout_seconds=True), False, None),
    ("distributed-script", _distributed(entrypoint="train.py", num_workers=2), True, None),
    ("distributed-function", _distributed(function="pkg:train", function_args=[1]), True, None),
    ("distributed-neither", _distributed(num_workers=2), False, None),
    ("distributed-both", _distributed(entrypoint="t.py", function="pkg:train"), False, None),
    ("distributed-script-args", _distributed(entrypoint="t.py", function_args=[1]), False, None),
    ("distributed-function-args", _distributed(function="pkg:f", args=["--x"]), False, None),
    ("distributed-absolute-script", _distributed(entrypoint="/t.py"), False, None),
    (
        "distributed-retry",
        {**_distributed(entrypoint="t.py"), "retry": {"max_attempts": 2}},
        False,
        None,
    ),
    ("distributed-nccl-cpu", _distributed(entrypoint="t.py", comm_backend="nccl"), False, None),
    (
        "distributed-nccl-cuda",
        _distributed({"profile": "pytorch-cuda"}, entrypoint="t.py", comm_backend="nccl"),
        True,
        None,
    ),
    ("port-string", _distributed(entrypoint="t.py", rendezvous={"port": "29500"}), False, None),
    ("port-range", _distributed(entrypoint="t.py", rendezvous={"port": 70000}), False, None),
    ("retry-on-unknown", _command(retry={"retry_on": ["oom"]}), False, None),
    ("retry-at-bound", _command(retry={"max_attempts": 100}), True, None),
    ("retry-huge", _command(retry={"max_attempts": 10**30}), False, None),
    ("timeout-past-30-days", _command(timeout_seconds=2592001), False, None),
    ("port-zero", _distributed(entrypoint="t.py", rendezvous={"port": 0}), False, None),
    ("name-trailing-newline", _command(name="job\n"), False, None),
    ("name-arabic-indic-digits", _command(name="job\u0661"), False, None),
    (
        "capability-arabic-indic-digits",
        _resources(accelerator="cuda", min_cuda_compute_capability="\u0668.\u0660"),
        False,
        None,
    ),
    (
        "entrypoint-trailing-newline",
        {"workload": {"kind": "function", "entrypoint": "m:f\n"}},
        False,
        None,
    ),
    ("env-name-trailing-newline", _command(env={"EPOCHS\n": "3"}), False, None),
    ("os-trailing-newline", _resources(os=["linux\n"]), False, None),
    (
        "gpu-model-trailing-newline",
        _resources(accelerator="cuda", gpu_models=["A100\n"]),
        False,
        None,
    ),
    ("input-artifact-empty", _command(inputs=[{"artifact": "", "path": "x"}]), False, None),
    (
        "input-dotdot-newline-is-a-name",
        _command(inputs=[{"artifact": "a", "path": "a/..\n"}]),
        True,
        None,
    ),
    (
        "input-drive-letter-only-ascii",
        _command(inputs=[{"artifact": "a", "path": "\xe9:x"}]),
        True,
        None,
    ),
    ("setup-requirements-absolute", _command(setup={"requirements_file": "/etc/x"}), False, None),
    ("setup-find-links-dotdot", _command(setup={"find_links": ["../wheels"]}), False, None),
    ("setup-find-links-ok", _command(setup={"find_links": ["wheels"]}), True, None),
    ("setup-index-url-space", _command(setup={"index_url": "https://a b"}), False, None),
    ("setup-index-url-ok", _command(setup={"index_url": "https://pypi.org/simple"}), True, None),
    (
        "pep-508-requirement",
        _command(setup={"pip": ["not a requirement!"]}),
        False,
        "pep-508-requirement",
    ),
]


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = jobspec_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _validate_says(spec: dict[str, Any]) -> bool:
    try:
        validate_spec(copy.deepcopy(spec))
    except SpecError:
        return False
    return True


@pytest.mark.parametrize(("case", "spec", "valid", "only"), CASES, ids=[c[0] for c in CASES])
def test_schema_and_validate_agree(
    validator: jsonschema.Draft202012Validator,
    case: str,
    spec: dict[str, Any],
    valid: bool,
    only: str | None,
) -> None:
    assert _validate_says(spec) is valid, case
    schema_errors = [e.message for e in validator.iter_errors(spec)]
    if only is None:
        assert (not schema_errors) is valid, schema_errors
    else:
        assert only in VALIDATE_ONLY
        assert not schema_errors, f"{case}: the schema now carries {only}; drop it from the list"


def test_every_validate_only_rule_has_a_case() -> None:
    used = {only for *_, only in CASES if only}
    assert used == set(VALIDATE_ONLY)


def test_normalized_specs_satisfy_the_schema(validator: jsonschema.Draft202012Validator) -> None:
    """What validate prints (every default filled in) is itself a valid job file."""
    for case, spec, valid, _ in CASES:
        if valid:
            normalized = validate_spec(copy.deepcopy(spec)).model_dump(mode="json")
            errors = [e.message for e in validator.iter_errors(normalized)]
            assert not errors, (case, errors)


def test_defaults_per_accelerator_are_published(validator: jsonschema.Draft202012Validator) -> None:
    rules = validator.schema["$defs"]["ResourceRequest"]["allOf"]
    gpu_rule = next(r for r in rules if "else" in r)
    assert gpu_rule["then"]["properties"]["gpu_count"]["default"] == 0
    assert gpu_rule["else"]["properties"]["gpu_count"]["default"] == 1


def _numeric_fields(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every integer or number property of the published schema: "Model.field" -> its schema."""

    def numeric(node: dict[str, Any]) -> dict[str, Any] | None:
        options = [node, *node.get("anyOf", [])]
        return next((o for o in options if o.get("type") in ("integer", "number")), None)

    found: dict[str, dict[str, Any]] = {}
    models = {**schema["$defs"], "JobSpec": schema}
    for model, definition in models.items():
        for field, node in definition.get("properties", {}).items():
            leaf = numeric(node)
            if leaf is not None:
                found[f"{model}.{field}"] = leaf
    return found


def test_every_number_has_a_published_upper_bound() -> None:
    fields = _numeric_fields(jobspec_schema())
    assert {"RetryPolicy.max_attempts", "JobSpec.timeout_seconds", "Rendezvous.port"} <= set(fields)
    unbounded = sorted(name for name, leaf in fields.items() if "maximum" not in leaf)
    assert not unbounded, f"numbers without a maximum: {unbounded}"


def test_the_readings_page_lists_every_bound() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "jobspec-readings.md").read_text()
    assert "## Numeric bounds" in page
    section = page.split("## Numeric bounds", 1)[1].split("\n## ", 1)[0]
    for name, leaf in _numeric_fields(jobspec_schema()).items():
        field = name.split(".", 1)[1]
        maximum = float(leaf["maximum"])
        written = str(int(maximum)) if maximum.is_integer() else str(maximum)
        named = re.compile(rf"`([a-z_]+\.)*{field}`")
        rows = [line for line in section.splitlines() if named.search(line)]
        assert rows, f"{name} is missing from the bounds table"
        assert any(written in row.replace(",", "") for row in rows), (
            f"{name}: no row says {written}"
        )
