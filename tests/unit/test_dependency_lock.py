"""`.ci/dev.lock` pins every package the project and its tests name, within what they allow.

CI installs from the lock, so a requirement added to a pyproject.toml without compiling the lock
again would be installed at whatever version the registry serves that day: this fails first.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip(
    "tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib"
)

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / ".ci" / "dev.lock"


def locked_versions() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in LOCK.read_text().splitlines():
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if match:
            pins[canonicalize_name(match.group(1))] = Version(match.group(2))
    return pins


def named_requirements() -> list[Requirement]:
    def project(path: Path) -> dict:
        with path.open("rb") as handle:
            return tomllib.load(handle)["project"]

    core = project(ROOT / "pyproject.toml")
    named = list(core["dependencies"])
    for extra in ("dev", "postgres", "docs"):
        named += core["optional-dependencies"][extra]
    for plugin in sorted((ROOT / "providers").glob("*/pyproject.toml")):
        named += [r for r in project(plugin).get("dependencies", []) if r != "gpulayer"]
    return [Requirement(text) for text in named]


def test_every_named_requirement_is_pinned_within_its_range() -> None:
    pins = locked_versions()
    assert len(pins) > 50, "the lock should pin the whole tree, not only direct requirements"
    for requirement in named_requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is not in .ci/dev.lock: compile the lock again"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{requirement.name}: the lock pins {pins[name]}, outside {requirement.specifier}"
        )


def test_the_lock_installs_the_project_and_every_plugin_editable() -> None:
    editable = {
        line.split(maxsplit=1)[1].strip()
        for line in LOCK.read_text().splitlines()
        if line.startswith("-e ")
    }
    plugins = {f"providers/{p.parent.name}" for p in (ROOT / "providers").glob("*/pyproject.toml")}
    assert editable == {"."} | plugins
