"""Each Alembic revision carries its own table definitions: neither a revision nor Alembic's
environment reaches today's `gpulayer.control.tables`, directly or through another module of
gpulayer, so replaying an old revision runs against the columns it was written for. And the
schema version is kept in one place: the newest revision's file name."""

from __future__ import annotations

import ast
from pathlib import Path

from gpulayer.control import schema

ROOT = Path(__file__).resolve().parents[2]
MIGRATIONS = ROOT / "gpulayer" / "control" / "migrations"
TODAYS_TABLES = "gpulayer.control.tables"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in names if name.startswith("gpulayer")}


def _source_of(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _reaches(path: Path, target: str) -> list[str]:
    """The chain of gpulayer imports from ``path`` to ``target``, or [] when none leads there."""
    seen: set[str] = set()
    frontier: list[tuple[str, list[str]]] = [(name, [name]) for name in _imports(path)]
    while frontier:
        module, chain = frontier.pop()
        if module == target:
            return chain
        if module in seen:
            continue
        seen.add(module)
        source = _source_of(module)
        if source is not None:
            frontier += [(name, [*chain, name]) for name in _imports(source)]
    return []


def test_no_revision_reaches_todays_tables() -> None:
    sources = [MIGRATIONS / "env.py", *sorted((MIGRATIONS / "versions").glob("*.py"))]
    assert len(sources) > 10
    for source in sources:
        chain = _reaches(source, TODAYS_TABLES)
        assert not chain, f"{source.name} reaches today's tables: {' -> '.join(chain)}"


def test_the_chain_finder_sees_an_import_through_another_module() -> None:
    assert _reaches(ROOT / "gpulayer" / "control" / "schema.py", TODAYS_TABLES)


def test_the_schema_version_is_the_newest_revision_file() -> None:
    numbers = sorted(
        p.name[:4] for p in (MIGRATIONS / "versions").glob("[0-9][0-9][0-9][0-9]_*.py")
    )
    assert numbers[-1] == schema.HEAD
    assert numbers == [schema.revision_of_number(n) for n in range(1, int(schema.HEAD) + 1)]
    tables_source = (ROOT / "gpulayer" / "control" / "tables.py").read_text()
    assert "SCHEMA_VERSION" not in tables_source
