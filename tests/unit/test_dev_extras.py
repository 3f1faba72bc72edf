"""The dev extras name every third-party package the tests import.

CI installs `.[dev]` and the provider plugins (all from `.ci/dev.lock`) and the packages
`.ci/install` pins by hand (torch); a test that imports anything else passes only where the
machine happens to have it. This reads the imports of every file under tests/ and checks each
third-party one against what those installs name, so a missing package fails here rather than
on a clean machine.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip(
    "tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib"
)

ROOT = Path(__file__).resolve().parents[2]

# Import names whose distribution is called something else. `google` is a namespace shared by
# several distributions; any of the GCP plugin's google-* dependencies provides it.
DISTRIBUTIONS_OF_IMPORT: dict[str, set[str]] = {
    "yaml": {"pyyaml"},
    "google": {"google-auth", "google-cloud-compute", "google-cloud-billing"},
    "flask_cors": {"flask-cors"},
}

# Modules of a package that need more than the package itself: moto's server runs on Flask.
EXTRA_NEEDS_OF_MODULE: dict[str, set[str]] = {
    "moto.moto_server": {"flask", "flask-cors"},
}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, f"cannot read a distribution name from {requirement!r}"
    return canonical(match.group(1))


def requirement_extras(requirement: str) -> set[str]:
    match = re.match(r"\s*[A-Za-z0-9][A-Za-z0-9._-]*\[([^\]]*)\]", requirement)
    return {canonical(extra) for extra in match.group(1).split(",")} if match else set()


def load_toml(path: Path) -> dict:
    with path.open("rb") as handle:
        return tomllib.load(handle)


def installed_by_ci() -> set[str]:
    """Everything CI installs by name: core deps, dev extras, the plugins' deps, pinned extras."""
    project = load_toml(ROOT / "pyproject.toml")["project"]
    requirements = list(project["dependencies"]) + list(project["optional-dependencies"]["dev"])
    for plugin in sorted((ROOT / "providers").glob("*/pyproject.toml")):
        requirements += load_toml(plugin)["project"].get("dependencies", [])
    names = {requirement_name(r) for r in requirements}
    names |= {
        f"{requirement_name(r)}[{extra}]" for r in requirements for extra in requirement_extras(r)
    }
    # `.ci/install` installs torch (a build that lies on the disk) from a lock of its own.
    for line in (ROOT / ".ci" / "torch.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            names.add(requirement_name(line))
    return names


def local_module_names() -> set[str]:
    """Names a test can import from the repository itself rather than from an installed package."""
    names = {"gpulayer", "tests", "bench"}  # the repository's own top-level folders
    names |= {path.name for path in (ROOT / "providers").glob("*/gpulayer_*") if path.is_dir()}
    for path in (ROOT / "tests").rglob("*.py"):
        names.add(path.stem)
        # Modules a test writes itself before importing them (a source folder it ships).
        names |= set(re.findall(r"[\"'/]([A-Za-z_][A-Za-z0-9_]*)\.py[\"']", path.read_text()))
    for path in (ROOT / "tests").rglob("__init__.py"):
        names.add(path.parent.name)
    return names


def imported_modules() -> dict[str, set[str]]:
    """Every absolute import under tests/: full dotted name -> files that import it."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                found.setdefault(module, set()).add(str(path.relative_to(ROOT)))
    return found


def third_party(modules: dict[str, set[str]]) -> dict[str, set[str]]:
    local = local_module_names()
    tops: dict[str, set[str]] = {}
    for module, files in modules.items():
        top = module.split(".", 1)[0]
        if top in sys.stdlib_module_names or top in local:
            continue
        tops.setdefault(top, set()).update(files)
    return tops


def test_every_third_party_import_of_the_tests_is_installed_by_ci() -> None:
    available = installed_by_ci()
    missing = []
    for top, files in sorted(third_party(imported_modules()).items()):
        wanted = DISTRIBUTIONS_OF_IMPORT.get(top, {canonical(top)})
        if not wanted & available:
            missing.append(f"{top} (imported by {', '.join(sorted(files)[:3])})")
    assert not missing, (
        "tests import packages that neither pyproject's dev extras, the core dependencies, the "
        "provider plugins nor .ci/run install: " + "; ".join(missing)
    )


def test_modules_that_need_extra_packages_have_them() -> None:
    available = installed_by_ci()
    modules = imported_modules()
    missing = []
    for prefix, needs in sorted(EXTRA_NEEDS_OF_MODULE.items()):
        if not any(m == prefix or m.startswith(prefix + ".") for m in modules):
            continue
        package = prefix.split(".", 1)[0]
        with_server_extra = f"{package}[server]" in available
        absent = sorted(n for n in needs if n not in available)
        if absent and not with_server_extra:
            missing.append(f"{prefix} needs {', '.join(absent)}")
    assert not missing, "; ".join(missing)


def test_the_reading_sees_the_packages_known_to_be_imported() -> None:
    # Guards the reader itself: were it to find nothing, the checks above would pass vacuously.
    tops = third_party(imported_modules())
    assert {"pytest", "httpx", "yaml", "moto"} <= set(tops)
    assert "gpulayer" not in tops and "os" not in tops
