"""Hypothesis strategies for JobSpec data: valid specs, and specs whose strings and numbers sit
at the edges where readers of the contract may differ (a trailing newline, a Unicode digit, an
empty string, a length or number bound, a path that is almost relative).

``specs()`` draws only valid specs. ``edge_specs(field)`` draws one of them with one field (a
key of EDITS) moved to an edge, valid or not; it never draws what only `gpulayer validate` can
judge (the rules tests/unit/test_spec_schema.py lists in VALIDATE_ONLY: unique secret names and
input paths, env and secrets apart, PEP 440 and PEP 508 grammars), so the published schema and
`validate` must agree on every spec it draws.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from gpulayer.spec import PROFILES
from gpulayer.spec.models import (
    MAX_ATTEMPTS,
    MAX_TIMEOUT_SECONDS,
    TORCHRUN_ENV_NAMES,
)

names = st.from_regex(r"[A-Za-z0-9_.-]{1,63}", fullmatch=True)
env_names = st.from_regex(r"[A-Z][A-Z0-9_]{0,10}", fullmatch=True).filter(
    lambda n: not n.startswith(("GPULAYER_", "TORCHELASTIC_")) and n not in TORCHRUN_ENV_NAMES
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
distributed_command = st.fixed_dictionaries(
    {
        "kind": st.just("distributed"),
        "command": st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=3),
        "num_workers": st.integers(1, 8),
    },
    optional={"procs_per_worker": st.integers(1, 8)},
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
    workload = draw(st.one_of(command, function, distributed, distributed_command))
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


# --- values at the edges --------------------------------------------------------------------

# Characters that one reader of a pattern takes for another: digits that are not ASCII (Python's
# \d matches them), spaces and line ends (Python's $ matches before a final "\n"; Python's \s
# and ECMA-262's differ on \x1c-\x1f, \x85 and \ufeff), letters that case-fold into ASCII, and
# the characters paths are made of.
UNICODE_DIGITS = ("\u0668", "\u0660", "\uff18", "\U0001d7d6", "\u0968", "\u00b2")
SPACES = (
    "\n",
    "\r\n",
    " ",
    "\t",
    "\x0b",
    "\x0c",
    "\x1c",
    "\x1f",
    "\x85",
    "\xa0",
    "\u2028",
    "\u3000",
    "\ufeff",
)
LETTERS = ("\u212a", "\u0130", "\u0131", "\u017f", "\xe9", "\xdf", "K", "i")
PATH_PARTS = ("/", "\\", ".", "..", ":", "\x00", "~")
ODD = UNICODE_DIGITS + SPACES + LETTERS + PATH_PARTS
odd_text = st.lists(st.sampled_from(ODD) | st.characters(codec="ascii"), max_size=6).map("".join)


def _with_unicode_digits(value: str, digit: str) -> str:
    return "".join(digit if c.isascii() and c.isdigit() else c for c in value)


@st.composite
def _one_edit(draw: st.DrawFn, valid: st.SearchStrategy[str]) -> str:
    value = draw(valid)
    at = draw(st.integers(0, len(value)))
    odd = draw(st.sampled_from(ODD))
    edit = draw(st.sampled_from(["append", "prepend", "insert", "replace", "digits", "upper"]))
    if edit == "append":
        return value + odd
    if edit == "prepend":
        return odd + value
    if edit == "insert":
        return value[:at] + odd + value[at:]
    if edit == "replace":
        return value[:at] + odd + value[at + 1 :]
    if edit == "digits":
        return _with_unicode_digits(value, draw(st.sampled_from(UNICODE_DIGITS)))
    return value.upper()


def _unicode_digits(pair: tuple[str, str]) -> str:
    value, digit = pair
    changed = _with_unicode_digits(value, digit)
    return changed if changed != value else value + digit


def edges(valid: st.SearchStrategy[str], *special: str) -> st.SearchStrategy[str]:
    """A valid value, or one at an edge: with a trailing newline or other space, its digits
    written in another script, empty, one odd character away, a listed special value, or
    short text made of odd characters. The edits readers are known to differ on come first
    and as often as the valid value."""
    options = [
        valid,
        valid.map(lambda v: v + "\n"),
        st.tuples(valid, st.sampled_from(SPACES)).map("".join),
        st.tuples(valid, st.sampled_from(UNICODE_DIGITS)).map(_unicode_digits),
        st.just(""),
        _one_edit(valid),
        odd_text,
    ]
    if special:
        options.append(st.sampled_from(special))
    return st.one_of(options)


def _paths(valid: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return edges(
        valid,
        ".",
        " . ",
        "\u3000.\u3000",
        "\ufeff",
        "\x1c.",
        "..",
        "a/..",
        "a/../b",
        "a\\..\\b",
        "a/..\n",
        "..\n/a",
        "a/...",
        "/abs",
        "\\abs",
        "//host/share",
        "C:x",
        "c:",
        "\xe9:x",
        "1:x",
        "\n:x",
        "a:b",
        "a\x00b",
        "~/x",
    )


names_at_edges = edges(names, "a" * 63, "a" * 64, "a" * 62 + "\n", "j\u0668b")
env_names_at_edges = edges(env_names, "GPULAYER_X", "TORCHELASTIC_Y", "RANK", "RANK\n", "_", "1A")
paths_at_edges = _paths(rel_paths)
entrypoints_at_edges = edges(
    st.sampled_from(["pkg.mod:fn", "m:f", "a_1.b:c.d"]), "m:f\n", "m:", ":f", "m:f:g", "1m:f"
)
capabilities_at_edges = edges(
    st.sampled_from(["8.0", "10.12", "9.0", "7.5"]), "8", "8.", ".0", "100.0", "8.0.1", "8,0"
)
gpu_models_at_edges = edges(
    st.sampled_from(["A100", "H100", "A100-80GB", "RTX 4090", "l4"]), "80GB", " A100", "A" * 64
)
os_at_edges = edges(st.sampled_from(["linux", "Linux", "DARWIN", "windows"]), "plan9")
arch_at_edges = edges(st.sampled_from(["x86_64", "AMD64", "arm64", "aarch64"]), "riscv")
framework_keys_at_edges = edges(
    st.sampled_from(["torch", "torch.cuda", "numpy", "jax", "a", "scikit-learn"]),
    "torch cuda",
    "-torch",
    "torch.",
)
urls_at_edges = edges(
    st.sampled_from(["https://pypi.org/simple", "http://10.0.0.1:8080/simple", "file:///wheels"]),
    "https://",
    "ftp://x",
    "https://a b",
    "https://\xe9",
    "HTTPS://x",
)
non_empty_at_edges = edges(st.sampled_from(["w1", "aws", "us-east-1", "KEY"]))


Data = dict[str, Any]


Edit = Callable[[st.DrawFn, Data], None]


def _at_edge(strategy: st.SearchStrategy[Any], put: Callable[[Data, Any], Any]) -> Edit:
    """An edit of spec data: draws a value from ``strategy`` and ``put(data, value)``."""

    def edit(draw: st.DrawFn, data: Data) -> None:
        put(data, draw(strategy))

    return edit


def _resources_on(data: Data, accelerator: str, **fields: Any) -> None:
    data["resources"] = {"accelerator": accelerator, **fields}


def _env_key(data: Data, name: str) -> None:
    if name not in {s["name"] for s in data["secrets"]}:
        data["env"][name] = "v"


def _secret(data: Data, name: str) -> None:
    if name not in data["env"] and name not in {s["name"] for s in data["secrets"]}:
        data["secrets"].append({"name": name})


def _secret_key(data: Data, key: str) -> None:
    if "SK" not in data["env"] and "SK" not in {s["name"] for s in data["secrets"]}:
        data["secrets"].append({"name": "SK", "key": key})


def _input(data: Data, item: tuple[str, str]) -> None:
    artifact, path = item
    if path not in {i["path"] for i in data["inputs"]}:
        data["inputs"].append({"artifact": artifact, "path": path})


def _workload(data: Data, workload: Data) -> None:
    data["workload"] = workload
    if workload["kind"] == "distributed":
        data["retry"] = {"max_attempts": 1}


def _setup(data: Data, field: str, value: Any) -> None:
    data.setdefault("setup", {"pip": ["numpy"]})[field] = value


def _retry(data: Data, attempts: Any) -> None:
    if data["workload"]["kind"] != "distributed":
        data["retry"] = {"max_attempts": attempts}


_NUMBER_EDGES = st.sampled_from([0, -1, 1, 1.5, 2.0, 64, 65, 1024, 1025, 1e-9, 1e300])

# One edit at an edge per field a rule (or a bound) reads, by the field it edits.
EDITS: dict[str, Edit] = {
    "name": _at_edge(names_at_edges, lambda d, v: d.update(name=v)),
    "env-name": _at_edge(env_names_at_edges, _env_key),
    "secret-name": _at_edge(env_names_at_edges, _secret),
    "secret-key": _at_edge(non_empty_at_edges, _secret_key),
    "input-path": _at_edge(st.tuples(st.just("s3://b/k"), paths_at_edges), _input),
    "input-artifact": _at_edge(st.tuples(non_empty_at_edges, st.just("edge_in")), _input),
    "command-program": _at_edge(
        edges(st.text(min_size=1, max_size=6)),
        lambda d, v: _workload(d, {"kind": "command", "command": [v, "x"]}),
    ),
    "function-entrypoint": _at_edge(
        entrypoints_at_edges, lambda d, v: _workload(d, {"kind": "function", "entrypoint": v})
    ),
    "distributed-function": _at_edge(
        entrypoints_at_edges, lambda d, v: _workload(d, {"kind": "distributed", "function": v})
    ),
    "distributed-script": _at_edge(
        _paths(rel_paths.map(lambda p: p + ".py")),
        lambda d, v: _workload(d, {"kind": "distributed", "entrypoint": v}),
    ),
    "rendezvous-port": _at_edge(
        st.sampled_from([0, 1, 65535, 65536, 2.0, 29500.5]),
        lambda d, v: _workload(
            d, {"kind": "distributed", "entrypoint": "t.py", "rendezvous": {"port": v}}
        ),
    ),
    "num-workers": _at_edge(
        _NUMBER_EDGES,
        lambda d, v: _workload(d, {"kind": "distributed", "entrypoint": "t.py", "num_workers": v}),
    ),
    "capability": _at_edge(
        capabilities_at_edges, lambda d, v: _resources_on(d, "cuda", min_cuda_compute_capability=v)
    ),
    "gpu-model": _at_edge(
        gpu_models_at_edges, lambda d, v: _resources_on(d, "cuda", gpu_models=[v])
    ),
    "gpu-count": _at_edge(_NUMBER_EDGES, lambda d, v: _resources_on(d, "cuda", gpu_count=v)),
    "cpu-cores": _at_edge(_NUMBER_EDGES, lambda d, v: _resources_on(d, "cpu", cpu_cores=v)),
    "os": _at_edge(os_at_edges, lambda d, v: _resources_on(d, "cpu", os=[v])),
    "cpu-arch": _at_edge(arch_at_edges, lambda d, v: _resources_on(d, "cpu", cpu_arch=[v])),
    "framework-key": _at_edge(
        framework_keys_at_edges, lambda d, v: _resources_on(d, "cpu", frameworks={v: ">=1"})
    ),
    "requirements-file": _at_edge(paths_at_edges, lambda d, v: _setup(d, "requirements_file", v)),
    "find-links": _at_edge(paths_at_edges, lambda d, v: _setup(d, "find_links", [v])),
    "index-url": _at_edge(urls_at_edges, lambda d, v: _setup(d, "index_url", v)),
    "extra-index-url": _at_edge(urls_at_edges, lambda d, v: _setup(d, "extra_index_urls", [v])),
    "worker-id": _at_edge(non_empty_at_edges, lambda d, v: d["placement"].update(worker_ids=[v])),
    "region": _at_edge(non_empty_at_edges, lambda d, v: d["placement"].update(regions=[v])),
    "timeout": _at_edge(
        st.sampled_from([None, 0, 0.5, MAX_TIMEOUT_SECONDS, MAX_TIMEOUT_SECONDS + 1, "1"]),
        lambda d, v: d.update(timeout_seconds=v),
    ),
    "max-attempts": _at_edge(st.sampled_from([0, 1, MAX_ATTEMPTS, MAX_ATTEMPTS + 1, True]), _retry),
}


@st.composite
def edge_specs(draw: st.DrawFn, field: str) -> Data:
    """A valid spec with ``field`` (a key of EDITS) moved to an edge: valid or not, but never
    invalid only by a rule JSON Schema cannot say. One edit a spec keeps a spec that one rule
    refuses from being refused by another as well, which would hide a disagreement."""
    data = draw(specs())
    data["setup"] = {"pip": ["numpy"], "find_links": ["wheels"]}
    EDITS[field](draw, data)
    return data
