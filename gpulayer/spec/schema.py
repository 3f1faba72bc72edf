"""The published JSON Schema (Draft 2020-12) of the JobSpec.

pydantic's schema carries types, bounds, enums and required fields; the validators' rules are
added here wherever JSON Schema can say them (patterns, reserved names, the program that may
not be empty, rules that depend on the accelerator or the workload kind, with the defaults they
imply), so that an editor rejects what ``gpulayer validate`` rejects. What only the validator
knows is listed, with the reason, in tests/unit/test_spec_schema.py.
"""

from __future__ import annotations

from typing import Any

from gpulayer.spec.currency import ISO_4217_CODES
from gpulayer.spec.models import (
    BLANK_PATH,
    CAPABILITY,
    CPU_ARCH_ALIASES,
    ENTRYPOINT,
    ENV_NAME,
    FRAMEWORK_KEY,
    NAME,
    OS_NAMES,
    RESERVED_ENV_PREFIXES,
    TORCHRUN_ENV_NAMES,
    JobSpec,
)
from gpulayer.spec.profiles import PROFILES

DIALECT = "https://json-schema.org/draft/2020-12/schema"

Schema = dict[str, Any]

# Every pattern here is read alike by Python's jsonschema and ECMA-262 validators (ajv):
# ASCII classes spelled out, and "the end" written as (?![\s\S]) (no character follows),
# since Python's $ also matches before a trailing newline. gpulayer.spec.patterns says more.
_END = r"(?![\s\S])"

ENV_NAME_SCHEMA: Schema = {
    "type": "string",
    "pattern": ENV_NAME.json_pattern,
    "not": {
        "anyOf": [
            {"enum": sorted(TORCHRUN_ENV_NAMES)},
            *({"pattern": f"^{prefix}"} for prefix in RESERVED_ENV_PREFIXES),
        ]
    },
}

# What _check_relative_path refuses: empty or "." (whitespace around them aside), NUL,
# absolute (POSIX, Windows root, UNC, drive letters) and any ".." part, with either separator.
RELATIVE_PATH: Schema = {
    "type": "string",
    "allOf": [
        {"not": {"pattern": BLANK_PATH.json_pattern}},
        {"not": {"pattern": "\u0000"}},
        {"not": {"pattern": r"^[/\\]"}},
        {"not": {"pattern": r"^[A-Za-z]:"}},
        {"not": {"pattern": rf"(^|[/\\])\.\.([/\\]|{_END})"}},
    ],
}


def _case_insensitive(words: list[str]) -> str:
    """``^(?:[Ll][Ii]...)$``: ECMA-262 patterns have no case-insensitive flag."""
    spelled = (
        "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else _escape(c) for c in word)
        for word in sorted(words)
    )
    return f"^(?:{'|'.join(spelled)}){_END}"


def _escape(char: str) -> str:
    return f"\\{char}" if char in r".^$*+?()[]{}|\/-" else char


def _set(field: str, value: Schema) -> Schema:
    """The field is present and matches ``value`` (an explicit null counts as absent where
    the value schema excludes null)."""
    return {"required": [field], "properties": {field: value}}


def _accelerators(wanted: set[str]) -> Schema:
    """The resources' accelerator, written or implied by the profile, is one of ``wanted``."""
    profiles = sorted(name for name, p in PROFILES.items() if p.accelerator in wanted)
    options: list[Schema] = [_set("accelerator", {"enum": sorted(wanted)})]
    if profiles:
        options.append(
            {**_set("profile", {"enum": profiles}), "not": {"required": ["accelerator"]}}
        )
    if "cpu" in wanted:  # cpu is the default when neither names an accelerator
        options.append(
            {
                "not": {
                    "anyOf": [
                        {"required": ["accelerator"]},
                        _set("profile", {"type": "string"}),
                    ]
                }
            }
        )
    return {"anyOf": options}


def _value(holder: Schema, field: str) -> Schema:
    """The non-null branch of a property's schema (pydantic writes X | None as anyOf)."""
    prop: Schema = holder["properties"][field]
    for branch in prop.get("anyOf", []):
        if branch.get("type") != "null":
            return dict(branch)
    return prop


def _refine(holder: Schema, field: str, extra: Schema) -> None:
    prop = holder["properties"][field]
    branches = prop.get("anyOf")
    if branches:
        for branch in branches:
            if branch.get("type") != "null" and "$ref" not in branch:
                branch.update(extra)
    else:
        prop.update(extra)


def _add_rules(holder: Schema, *rules: Schema) -> None:
    holder.setdefault("allOf", []).extend(rules)


def _job(document: Schema) -> None:
    _refine(document, "name", {"pattern": NAME.json_pattern})
    document["properties"]["env"]["propertyNames"] = ENV_NAME_SCHEMA
    distributed = _set("workload", _set("kind", {"const": "distributed"}))
    cuda = _accelerators({"cuda"})
    _add_rules(
        document,
        {
            "if": distributed,
            "then": {"properties": {"retry": {"properties": {"max_attempts": {"const": 1}}}}},
        },
        {
            "if": {
                "allOf": [
                    distributed,
                    _set("workload", _set("comm_backend", {"const": "nccl"})),
                ]
            },
            "then": {"required": ["resources"], "properties": {"resources": cuda}},
        },
        {
            "if": {"allOf": [distributed, _set("resources", cuda)]},
            "then": {
                "properties": {"workload": {"properties": {"comm_backend": {"default": "nccl"}}}}
            },
            "else": {
                "properties": {"workload": {"properties": {"comm_backend": {"default": "gloo"}}}}
            },
        },
    )


def _workloads(defs: Schema) -> None:
    command = defs["CommandWorkload"]
    command["properties"]["command"]["prefixItems"] = [{"type": "string", "minLength": 1}]
    _refine(defs["FunctionWorkload"], "entrypoint", {"pattern": ENTRYPOINT.json_pattern})
    distributed = defs["DistributedWorkload"]
    _refine(distributed, "function", {"pattern": ENTRYPOINT.json_pattern})
    _refine(distributed, "entrypoint", RELATIVE_PATH)
    distributed["properties"]["command"]["anyOf"][0]["prefixItems"] = [
        {"type": "string", "minLength": 1}
    ]
    script = _set("entrypoint", {"type": "string"})
    function = _set("function", {"type": "string"})
    program = _set("command", {"type": "array"})
    no_function_args = {
        "properties": {"function_args": {"maxItems": 0}, "function_kwargs": {"maxProperties": 0}}
    }
    _add_rules(
        distributed,
        {"oneOf": [script, function, program]},
        {"if": script, "then": no_function_args},
        {"if": program, "then": no_function_args},
        {"if": function, "then": {"properties": {"args": {"maxItems": 0}}}},
        {"if": program, "then": {"properties": {"args": {"maxItems": 0}}}},
    )


def _resources(resources: Schema) -> None:
    props = resources["properties"]
    _refine(resources, "min_cuda_compute_capability", {"pattern": CAPABILITY.json_pattern})
    props["os"]["items"]["pattern"] = _case_insensitive(sorted(OS_NAMES))
    props["cpu_arch"]["items"]["pattern"] = _case_insensitive(sorted(CPU_ARCH_ALIASES))
    props["frameworks"]["propertyNames"] = {"pattern": FRAMEWORK_KEY.json_pattern}
    profile_rules = [
        {
            "if": _set("profile", {"const": name}),
            "then": {"properties": {"accelerator": {"const": profile.accelerator}}},
        }
        for name, profile in PROFILES.items()
    ]
    no_gpu = {"enum": [None]}
    _add_rules(
        resources,
        *profile_rules,
        {
            "if": _accelerators({"cpu"}),
            "then": {
                "properties": {
                    "gpu_count": {"enum": [0, None], "default": 0},
                    "gpu_memory_gb": no_gpu,
                    "gpu_memory_kind": no_gpu,
                    "gpu_slices": {"const": False},
                }
            },
            "else": {"properties": {"gpu_count": {"not": {"const": 0}, "default": 1}}},
        },
        {
            "if": {"not": _accelerators({"cuda"})},
            "then": {"properties": {"min_cuda_compute_capability": no_gpu}},
        },
    )


def _placement(placement: Schema) -> None:
    props = placement["properties"]
    props["fallback_targets"]["uniqueItems"] = True
    props["currency"]["enum"] = sorted(ISO_4217_CODES)
    default = props["target"].get("default")
    rules = []
    for target in props["target"]["enum"]:
        chosen: Schema = {"properties": {"target": {"const": target}}}
        if target != default:
            chosen["required"] = ["target"]  # an absent target is the default one only
        rules.append(
            {
                "if": chosen,
                "then": {
                    "properties": {"fallback_targets": {"not": {"contains": {"const": target}}}}
                },
            }
        )
    _add_rules(placement, *rules)


def _setup(setup: Schema) -> None:
    props = setup["properties"]
    _refine(setup, "requirements_file", RELATIVE_PATH)
    props["find_links"]["items"].update(RELATIVE_PATH)


def openapi_keywords_dropped(node: Any) -> Any:
    """``node`` without pydantic's OpenAPI ``discriminator``, which is no JSON Schema keyword
    (strict validators such as ajv refuse a schema holding it); the ``oneOf`` beside it, over
    workloads whose ``kind`` is a ``const``, already says everything it does."""
    if isinstance(node, dict):
        return {k: openapi_keywords_dropped(v) for k, v in node.items() if k != "discriminator"}
    if isinstance(node, list):
        return [openapi_keywords_dropped(item) for item in node]
    return node


def jobspec_schema() -> Schema:
    document: Schema = JobSpec.model_json_schema()
    defs = document["$defs"]
    _job(document)
    _workloads(defs)
    _resources(defs["ResourceRequest"])
    _placement(defs["PlacementPolicy"])
    _setup(defs["Setup"])
    defs["SecretRef"]["properties"]["name"].update(ENV_NAME_SCHEMA)
    defs["InputRef"]["properties"]["path"].update(RELATIVE_PATH)
    defs["OutputsPolicy"]["properties"]["paths"]["items"].update(RELATIVE_PATH)
    return {"$schema": DIALECT, **openapi_keywords_dropped(document)}
