"""gpulayer.cloud's public API is what provider plugins use, and all they use of gpulayer."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import gpulayer.cloud as cloud

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_FILES = sorted((ROOT / "providers").glob("*/gpulayer_*/**/*.py"))
HEAVY = ("boto3", "botocore", "google.cloud", "paramiko", "fastapi", "sqlalchemy", "torch")


def _of_gpulayer(module: str | None) -> bool:
    return module is not None and (module == "gpulayer" or module.startswith("gpulayer."))


def _gpulayer_imports(tree: ast.AST) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every import of gpulayer; names empty for ``import x``."""
    found: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _of_gpulayer(alias.name):
                    found.append((node.lineno, alias.name, []))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _of_gpulayer(node.module):
            found.append((node.lineno, str(node.module), [a.name for a in node.names]))
    return found


@pytest.mark.parametrize("name", cloud.__all__)
def test_every_exported_name_resolves(name: str) -> None:
    assert getattr(cloud, name) is not None


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        cloud.Nothing  # noqa: B018


def test_type_checkers_see_the_names_the_package_loads() -> None:
    # The TYPE_CHECKING block and _EXPORTS say the same thing twice, one for mypy, one at
    # run time; a name in one only would be missing or untyped in plugins.
    source = Path(cloud.__file__).read_text()
    block = next(
        n
        for n in ast.parse(source).body
        if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING"
    )
    typed = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names:
            assert alias.asname == alias.name, f"{alias.name}: re-export it as itself"
            typed[alias.name] = node.module
    assert typed == cloud._EXPORTS
    assert cloud.__all__ == sorted(typed)


def test_plugins_import_nothing_of_gpulayer_but_its_cloud_api() -> None:
    assert {p.parts[-3] for p in PLUGIN_FILES} >= {"aws", "gcp", "ssh"}
    exported = set(cloud.__all__)
    wrong = []
    for path in PLUGIN_FILES:
        where = path.relative_to(ROOT)
        for line, module, names in _gpulayer_imports(ast.parse(path.read_text())):
            if module != "gpulayer.cloud" or not names:
                wrong.append(f"{where}:{line}: imports {module}")
                continue
            wrong += [f"{where}:{line}: {n} is not exported" for n in names if n not in exported]
    assert wrong == []


def test_the_rule_catches_an_import_past_the_api() -> None:
    tree = ast.parse(
        "import gpulayer.ssh.session\n"
        "from gpulayer.cloud.cache import DiskCache\n"
        "from gpulayer import errors\n"
        "from gpulayer.cloud import Offer\n"
        "from gpulayer_ssh import hardware\n"
        "def f():\n    from gpulayer.worker.probe import cpu_arch\n"
    )
    modules = [module for _, module, _ in _gpulayer_imports(tree)]
    assert sorted(modules) == sorted(
        [
            "gpulayer.ssh.session",
            "gpulayer.cloud.cache",
            "gpulayer",
            "gpulayer.cloud",
            "gpulayer.worker.probe",
        ]
    )


def test_importing_the_api_and_the_plugins_loads_no_heavy_library() -> None:
    code = (
        "import sys, gpulayer.cloud, gpulayer_aws, gpulayer_gcp, gpulayer_ssh\n"
        "from gpulayer.cloud import Offer, SshSession, DiskCache, parse_nvidia_query\n"
        f"print(','.join(h for h in {HEAVY!r} if h in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == ""
