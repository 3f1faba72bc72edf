"""Size limits for all code outside tests (gpulayer/, the provider plugins, bench/): no module
over 600 lines, no class over 30 methods, no function over 80 lines. Each entry of ALLOWED
names what is over a limit today and why; one that falls within the limits must leave the
list, so the list only shrinks."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("gpulayer", "providers", "bench")

MODULE_LINES = 600
CLASS_METHODS = 30
FUNCTION_LINES = 80

# (kind, module relative to the repository, name) -> why it is over its limit still.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("module", "bench/throughput.py", ""): "one script of side-by-side scenarios, run whole",
    ("function", "bench/throughput.py", "slurm_cluster"): "a Slurm cluster's set-up, one sequence",
    ("function", "bench/faults.py", "measure"): "the fault rows in the order they print",
    ("function", "bench/placement.py", "main"): "the placement rows in the order they print",
}


def _oversized() -> set[tuple[str, str, str]]:
    found: set[tuple[str, str, str]] = set()
    paths = sorted(path for top in CHECKED for path in (ROOT / top).rglob("*.py"))
    for path in paths:
        where = str(path.relative_to(ROOT))
        if "/migrations/versions/" in where:
            continue  # a revision is history: written once, replayed as it is, never edited
        text = path.read_text()
        if len(text.splitlines()) > MODULE_LINES:
            found.add(("module", where, ""))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                methods = [
                    n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
                ]
                if len(methods) > CLASS_METHODS:
                    found.add(("class", where, node.name))
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                if node.end_lineno - node.lineno + 1 > FUNCTION_LINES:
                    found.add(("function", where, node.name))
    return found


def test_nothing_new_is_over_its_size_limit() -> None:
    over = _oversized()
    assert sorted(over - ALLOWED.keys()) == []


def test_every_allowed_excess_is_still_over_its_limit() -> None:
    assert sorted(ALLOWED.keys() - _oversized()) == []
