"""What code a local control plane runs: gpulayer's version, its source and the plugins.

The daemon writes this into server.json when it starts; a CLI whose own fingerprint differs
knows the daemon runs other code (an upgrade, an edited checkout, a plugin installed since)
and restarts it once no job is live. Cheap enough for every command: file names, sizes and
modification times are digested, not contents.
"""

from __future__ import annotations

import hashlib
import os
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

PLUGIN_GROUP = "gpulayer.providers"


def _tree_digest(digest: Any, root: Path) -> None:
    stack = [root]
    while stack:
        directory = stack.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith(".") or entry.name == "__pycache__":
                continue
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
            elif entry.name.endswith((".py", ".json", ".yaml", ".sh", ".txt", ".toml")):
                stat = entry.stat()
                digest.update(f"{entry.path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())


def _plugin_dirs() -> list[tuple[str, Path | None]]:
    """(entry point line, the plugin's top-level package directory when found)."""
    from importlib.util import find_spec

    found = []
    for ep in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: (e.name, e.value)):
        dist = getattr(ep, "dist", None)
        version = dist.version if dist is not None else "?"
        line = f"{ep.name}={ep.value}@{version}"
        top = ep.value.split(":")[0].split(".")[0]
        directory = None
        try:
            spec = find_spec(top)  # a top-level name: nothing is imported
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            directory = Path(next(iter(spec.submodule_search_locations)))
        found.append((line, directory))
    return found


def _path_stamp() -> str:
    """sys.path and each directory's modification time: installing or removing a
    distribution (or a .pth file) touches its directory, so an unchanged stamp means an
    unchanged set of plugins without scanning every distribution's metadata."""
    import sys

    digest = hashlib.sha256()
    # sys.path[0] is the script's folder or the working directory: the daemon's and a
    # command's differ, and neither holds installed plugins.
    entries = sys.path if getattr(sys.flags, "safe_path", False) else sys.path[1:]
    for entry in entries:
        try:
            stamp = os.stat(entry or ".").st_mtime_ns
        except OSError:
            stamp = 0
        digest.update(f"{entry}\0{stamp}\n".encode())
    return digest.hexdigest()[:16]


_PACKAGE_DIR = Path(__file__).resolve().parents[1]


def _source(plugin_dirs: list[str]) -> str:
    source = hashlib.sha256()
    _tree_digest(source, _PACKAGE_DIR)
    for directory in plugin_dirs:
        _tree_digest(source, Path(directory))
    return source.hexdigest()[:16]


def code_fingerprint() -> dict[str, Any]:
    """The full fingerprint, written by the daemon when it starts."""
    from gpulayer import __version__

    found = _plugin_dirs()
    plugin_dirs = [str(d) for _, d in found if d is not None]
    return {
        "version": __version__,
        "source": _source(plugin_dirs),
        "plugins": [line for line, _ in found],
        "plugin_dirs": plugin_dirs,
        "paths": _path_stamp(),
    }


def what_changed(started: Any) -> list[str]:
    """Why the code a daemon started with (its recorded fingerprint) is not the code here, in
    words; empty when it is the same. Scans plugin metadata only when sys.path changed."""
    from gpulayer import __version__

    if not isinstance(started, dict) or "plugin_dirs" not in started:
        return ["it was started by a gpulayer that records no code fingerprint"]
    reasons = []
    if started.get("version") != __version__:
        reasons.append(f"gpulayer {started.get('version')} is now {__version__}")
    if started.get("paths") != _path_stamp():
        before = _by_name(started.get("plugins") or [])
        after = _by_name([line for line, _ in _plugin_dirs()])
        if before != after:
            parts = [f"+{n}" for n in sorted(after.keys() - before.keys())]
            parts += [f"-{n}" for n in sorted(before.keys() - after.keys())]
            parts += [
                f"~{n}" for n in sorted(before.keys() & after.keys()) if before[n] != after[n]
            ]
            reasons.append(f"the installed plugins changed ({', '.join(parts)})")
    if not reasons and started.get("source") != _source(list(started["plugin_dirs"])):
        reasons.append("gpulayer's source changed")
    return reasons


def _by_name(lines: list[str]) -> dict[str, str]:
    return {line.split("=", 1)[0]: line for line in lines}
