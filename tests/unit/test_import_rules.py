"""The import rules of DESIGN.md ("Layout", "Imports point one way"), held over the source.

Every module of gpulayer/ and of each plugin under providers/ is read with ast; every import
counts, including those inside functions (lazy) and under TYPE_CHECKING, since each is an
arrow between two parts. A new arrow between packages is a change to ALLOWED below, seen in
review; a failing rule names the module, the line and the import.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Which of gpulayer's packages (or top-level modules) each one may import, besides itself.
# "gpulayer" is the package's own __init__ (the `import gpulayer as gl` face).
ALLOWED: dict[str, frozenset[str]] = {
    name: frozenset(targets)
    for name, targets in {
        "errors": set(),
        "backoff": set(),
        "procs": set(),
        "hardware": {"spec"},
        "spec": {"errors"},
        # backoff: the client's waits for a control plane that restarts take a named policy.
        "protocol": {"errors", "backoff"},
        "schedules": {"spec", "errors"},
        "scheduler": {"spec", "errors", "hardware"},
        # The team queue's order, quotas and budgets: pure, it imports nothing of the project.
        "admission": set(),
        "ssh": {"errors", "backoff"},
        "ids": set(),
        "cloud": {"spec", "ssh", "errors", "backoff", "hardware", "protocol", "ids"},
        "control": {
            "spec", "protocol", "scheduler", "schedules", "cloud", "errors", "backoff", "procs",
            "ids", "admission",
        },
        "worker": {"spec", "protocol", "hardware", "errors", "backoff", "procs"},
        "sdk": {"spec", "protocol", "schedules", "control", "errors"},
        "cli": {
            "sdk", "spec", "protocol", "schedules", "errors", "control", "cloud", "worker",
            "hardware", "admission",
        },
        # The embedded daemon: the local control plane and its worker in one process. The one
        # module that joins the two (see gpulayer/embedded.py).
        "embedded": {"control", "worker"},
        "gpulayer": {"sdk", "spec", "schedules"},
        "__main__": {"cli"},
    }.items()
}  # fmt: skip

# Arrows allowed only into these modules (a package and everything under it), or only from
# these importers: the narrow doors through which one part may reach another.
ONLY_INTO: dict[tuple[str, str], frozenset[str]] = {
    # The CLI runs a worker through its one entry, starts the team server, manages the local
    # one (status, stop, restart) and reads settings; job operations go through the SDK.
    # `ls` checks its filters with the rules the API and the dashboard apply (job_filters).
    ("cli", "worker"): frozenset({"gpulayer.worker"}),
    ("cli", "control"): frozenset(
        {
            "gpulayer.control.job_filters",
            "gpulayer.control.paths",
            "gpulayer.control.server",
            "gpulayer.control.log_cap",
            "gpulayer.control.local_daemon",
            "gpulayer.control.environment",
        }
    ),
    ("cli", "cloud"): frozenset(
        {
            "gpulayer.cloud.config",
            "gpulayer.cloud.registry",
            "gpulayer.cloud.orchestrator_settings",
            "gpulayer.cloud.ranking",
            # `config check` logs into the hosts a launch writes job keys on.
            "gpulayer.cloud.key_check",
        }
    ),
    ("cli", "protocol"): frozenset({"gpulayer.protocol.client"}),
    # The bootstrap plan checks the dead-man action a cloud worker will be started with.
    ("cloud", "protocol"): frozenset({"gpulayer.protocol.deadman"}),
    # The SDK finds (or starts) the control plane: its home, tokens and the local daemon.
    ("sdk", "control"): frozenset(
        {"gpulayer.control.paths", "gpulayer.control.tokens", "gpulayer.control.local_daemon"}
    ),
}
# The cloud lifecycle reaches the control plane only through the interface it owns
# (gpulayer.cloud.lifecycle.ports), which the control plane implements: no arrow from cloud to
# control at all.
ONLY_FROM: dict[tuple[str, str], frozenset[str]] = {}

HEAVY = ("boto3", "google.cloud", "paramiko", "fastapi", "sqlalchemy", "torch", "uvicorn")


@dataclass(frozen=True)
class Import:
    module: str
    """The importing module."""
    target: str
    """The module imported (a submodule when `from package import submodule`)."""
    line: int
    text: str
    top_level: bool
    """Run when the module is imported: not inside a function, nor under TYPE_CHECKING."""

    def __str__(self) -> str:
        return f"{self.module}:{self.line}: {self.text}"


def _source_files() -> Iterator[tuple[str, Path]]:
    for path in sorted((ROOT / "gpulayer").rglob("*.py")):
        yield _module_name(path.relative_to(ROOT).parts), path
    for plugin in sorted((ROOT / "providers").glob("*/gpulayer_*")):
        for path in sorted(plugin.rglob("*.py")):
            yield _module_name(path.relative_to(plugin.parent).parts), path


def _module_name(parts: tuple[str, ...]) -> str:
    names = [*parts[:-1], parts[-1].removesuffix(".py")]
    if names[-1] == "__init__":
        names.pop()
    return ".".join(names)


@cache
def _modules() -> dict[str, Path]:
    return dict(_source_files())


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, top_level: bool) -> Iterator[tuple[ast.AST, bool]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _walk(child, False)
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for inner in child.body:
                yield inner, False
                yield from _walk(inner, False)
            for inner in child.orelse:
                yield inner, top_level
                yield from _walk(inner, top_level)
        else:
            yield child, top_level
            yield from _walk(child, top_level)


def _imports_of(module: str, path: Path) -> list[Import]:
    source = path.read_text()
    lines = source.splitlines()
    is_package = path.name == "__init__.py"
    found: list[Import] = []
    for node, top_level in _walk(ast.parse(source, str(path)), True):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        text = lines[node.lineno - 1].strip()
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                drop = node.level - 1 if is_package else node.level
                anchor = anchor[: len(anchor) - drop] if drop else anchor
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.append(submodule if submodule in _modules() else base)
        for target in targets:
            found.append(Import(module, target, node.lineno, text, top_level))
    return found


@cache
def _all_imports() -> tuple[Import, ...]:
    return tuple(i for module, path in _modules().items() for i in _imports_of(module, path))


def _part(module: str) -> str:
    """gpulayer.control.api -> control; gpulayer -> gpulayer; gpulayer_aws.x -> gpulayer_aws."""
    names = module.split(".")
    if names[0] != "gpulayer":
        return names[0]
    return names[1] if len(names) > 1 else "gpulayer"


def _under(module: str, roots: frozenset[str]) -> bool:
    return any(module == root or module.startswith(root + ".") for root in roots)


def _internal(imports: tuple[Import, ...]) -> list[Import]:
    return [i for i in imports if i.target.split(".")[0] == "gpulayer"]


def _arrow_problem(found: Import) -> str | None:
    source, target = _part(found.module), _part(found.target)
    if source == target or source.startswith("gpulayer_"):
        return None
    if found.target == "gpulayer":
        return None  # the version: the package's __init__ is loaded before any part of it
    if source not in ALLOWED:
        return f"{source} is not in the rules table (ALLOWED)"
    if target not in ALLOWED[source]:
        return f"{source} may not import {target}"
    into = ONLY_INTO.get((source, target))
    if into is not None and not _under(found.target, into):
        return f"{source} may import {target} only through {', '.join(sorted(into))}"
    allowed_from = ONLY_FROM.get((source, target))
    if allowed_from is not None and not _under(found.module, allowed_from):
        return f"only {', '.join(sorted(allowed_from))} of {source} may import {target}"
    return None


def _report(problems: list[str]) -> str:
    return "\n".join(["imports against the rules:", *problems])


def test_the_source_is_found() -> None:
    modules = _modules()
    assert "gpulayer.protocol.messages" in modules
    assert "gpulayer.worker.agent" in modules
    assert any(name.startswith("gpulayer_ssh") for name in modules)
    lazy = [i for i in _all_imports() if not i.top_level]
    assert lazy, "function-level imports are read too"
    assert "gpulayer.protocol.messages" in _import_graph()["gpulayer.worker.agent"]


def test_every_package_is_in_the_rules_table() -> None:
    parts = {_part(module) for module in _modules() if module.startswith("gpulayer")}
    missing = sorted(p for p in parts - set(ALLOWED) if not p.startswith("gpulayer_"))
    assert not missing, f"add these to ALLOWED in {Path(__file__).name}: {missing}"


def test_arrows_between_packages_follow_the_table() -> None:
    problems = [
        f"{found}  ({why})"
        for found in _internal(_all_imports())
        if (why := _arrow_problem(found)) is not None
    ]
    assert not problems, _report(problems)


def test_control_and_worker_meet_only_in_protocol() -> None:
    problems = [
        str(found)
        for found in _internal(_all_imports())
        if {_part(found.module), _part(found.target)} == {"control", "worker"}
    ]
    assert not problems, _report(problems)


def _plugin_problem(found: Import) -> str | None:
    own = found.module.split(".")[0]
    target = found.target
    if target == own or target.startswith(own + "."):
        return None
    if target.split(".")[0] != "gpulayer" and not target.startswith("gpulayer_"):
        return None  # a third-party or standard library module
    if target == "gpulayer.cloud":
        return None
    return f"a plugin imports gpulayer.cloud and itself only, not {target}"


def test_plugins_import_only_the_cloud_api() -> None:
    problems = [
        f"{found}  ({why})"
        for found in _all_imports()
        if found.module.startswith("gpulayer_") and (why := _plugin_problem(found)) is not None
    ]
    assert not problems, _report(problems)


def _import_graph(*, lazy: bool = False) -> dict[str, dict[str, Import]]:
    """Module -> the modules it imports when it is imported (top-level only), or at any time
    (lazy too; the package's own __init__, imported for the version, left out)."""
    modules = _modules()
    graph: dict[str, dict[str, Import]] = {module: {} for module in modules}
    for found in _all_imports():
        if not found.top_level and not lazy:
            continue
        target = found.target
        while target and target not in modules:  # `import a.b.c` names a name in a.b
            target = target.rpartition(".")[0]
        if lazy and target == "gpulayer":
            continue
        if target and target != found.module:
            graph[found.module].setdefault(target, found)
    return graph


def _cycles(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(graph[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph[nxt])))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    edge = Import("a", "b", 1, "import b", True)
    graph: dict[str, dict[str, Import]] = {"a": {"b": edge}, "b": {"c": edge}, "c": {"a": edge}}
    graph["d"] = {"a": edge}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b": edge}, "b": {}}) == []


def _circle_report(graph: dict[str, dict[str, Import]], components: list[list[str]]) -> str:
    problems = []
    for component in components:
        members = set(component)
        lines = [
            f"  {found}"
            for module in component
            for target, found in graph[module].items()
            if target in members
        ]
        problems.append("circle: " + " <-> ".join(component) + "\n" + "\n".join(lines))
    return "\n".join(problems)


def test_no_import_circles_between_modules() -> None:
    graph = _import_graph()
    components = _cycles(graph)
    assert not components, _circle_report(graph, components)


def test_no_new_circles_through_lazy_imports() -> None:
    graph = _import_graph(lazy=True)
    components = _cycles(graph)
    assert not components, _circle_report(graph, components)


_HEAVY_PROBE = """
import sys, traceback

heavy = {heavy!r}
seen = {{}}


class Witness:
    # Notes which gpulayer line asked for a heavy module first; finds nothing itself.
    def find_spec(self, name, path=None, target=None):
        top = next((h for h in heavy if name == h or name.startswith(h + ".")), None)
        if top is not None and top not in seen:
            frames = [f for f in traceback.extract_stack() if "/gpulayer" in f.filename]
            where = frames[-1] if frames else None
            seen[top] = f"{{where.filename}}:{{where.lineno}}: {{where.line}}" if where else "?"
        return None


sys.meta_path.insert(0, Witness())
import gpulayer.cli  # noqa: E402

for name, where in sorted(seen.items()):
    if name in sys.modules:
        print(f"{{name}} (first asked for at {{where}})")
"""


def test_importing_the_cli_loads_no_heavy_library() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _HEAVY_PROBE.format(heavy=HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.strip()
    assert not loaded, f"import gpulayer.cli loads:\n{loaded}"
