"""Which files a source bundle leaves out: the default excludes, every .gitignore on the way
down, and the source root's .gpulayerignore, with gitignore's semantics.

Its own module so that bundle.py keeps to making and unpacking archives; bundle.py
re-exports every name here, so callers import them from either.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pathspec

IGNORE_FILE = ".gpulayerignore"

GIT_IGNORE_FILE = ".gitignore"

DEFAULT_EXCLUDES: tuple[str, ...] = (
    "__pycache__/",
    "*.pyc",
    ".venv/",
    "venv/",
    "node_modules/",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
)


def parse_ignore(lines: Iterable[str]) -> pathspec.GitIgnoreSpec:
    """Rules with gitignore's semantics: '#' comments, '!' re-includes, a trailing '/' only
    matches directories, a '/' inside anchors at the rules' folder; the last match wins."""
    return pathspec.GitIgnoreSpec.from_lines(list(lines))


def is_ignored(rel_path: str, is_dir: bool, rules: pathspec.GitIgnoreSpec) -> bool:
    return _verdict(rules, rel_path, is_dir) is True


def _verdict(rules: pathspec.GitIgnoreSpec, rel_path: str, is_dir: bool) -> bool | None:
    """True ignored, False re-included, None when no rule speaks of the path."""
    return rules.check_file(rel_path + "/" if is_dir else rel_path).include


class IgnoreRules:
    """The default excludes, then every .gitignore down to a path (a deeper one overrides a
    shallower, as in git), then the source root's .gpulayerignore, which has the last word."""

    def __init__(self, root: Path) -> None:
        self._defaults = parse_ignore(DEFAULT_EXCLUDES)
        self._gitignores: dict[str, pathspec.GitIgnoreSpec] = {}
        self._own = parse_ignore(_read_lines(root / IGNORE_FILE))
        self.add_gitignore(root, "")

    def add_gitignore(self, folder: Path, rel_dir: str) -> None:
        """Take up ``folder``'s .gitignore, if it has one, for the paths under it."""
        lines = _read_lines(folder / GIT_IGNORE_FILE)
        if lines:
            self._gitignores[rel_dir] = parse_ignore(lines)

    def ignored(self, rel_path: str, is_dir: bool) -> bool:
        found = _verdict(self._defaults, rel_path, is_dir)
        parts = rel_path.split("/")
        for depth in range(len(parts)):
            base = "/".join(parts[:depth])
            rules = self._gitignores.get(base)
            if rules is not None:
                verdict = _verdict(rules, "/".join(parts[depth:]), is_dir)
                found = verdict if verdict is not None else found
        own = _verdict(self._own, rel_path, is_dir)
        return bool(own if own is not None else found)


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return []
