"""Building the wheelhouse once per gpulayer version, python, platform and source, and
finding it again in the cache (the user's, shared by every GPULAYER_HOME).

The cache key names the gpulayer version, the python and platform tags, and a digest of every
distribution's name and version (and of the source tree for an editable gpulayer), so any
change builds a new wheelhouse; only the newest few are kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform as _platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path

from gpulayer.cloud.wheelhouse.closure import (
    ROOT_DISTRIBUTION,
    SERVER_ONLY,
    canonical,
    worker_distributions,
)
from gpulayer.cloud.wheelhouse.errors import WheelhouseError
from gpulayer.cloud.wheelhouse.model import WheelFile, Wheelhouse
from gpulayer.cloud.wheelhouse.progress import BuildProgress, held
from gpulayer.cloud.wheelhouse.repack import (
    build_from_source,
    build_pip_runner,
    editable_source,
    is_link_only_install,
    repack_distribution,
    source_digest,
)
from gpulayer.cloud.wheelhouse.tags import host_platform_tag

FORMAT = 3
MANIFEST = "wheelhouse.json"
INSTALLER_DISTRIBUTION = "pip"


WHEELHOUSE_DIR_ENV = "GPULAYER_WHEELHOUSE_DIR"


def default_cache_dir() -> Path:
    """Where wheelhouses are built and kept: ``$GPULAYER_WHEELHOUSE_DIR``, else the user cache
    directory's ``wheelhouse`` (``~/.cache/gpulayer/wheelhouse`` on Linux). Never below a
    GPULAYER_HOME: a wheelhouse depends only on what is installed, so every home shares it."""
    chosen = os.environ.get(WHEELHOUSE_DIR_ENV)
    if chosen:
        return Path(chosen).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("gpulayer", appauthor=False)) / "wheelhouse"


def _python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def _interpreter_tag() -> str:
    return f"cp{sys.version_info.major}{sys.version_info.minor}"


def wheelhouse_key(
    distributions: list[metadata.Distribution], *, editable_digest: str | None = None
) -> str:
    gpulayer_version = next(
        (d.version for d in distributions if canonical(d.metadata["Name"]) == ROOT_DISTRIBUTION),
        "0",
    )
    digest = hashlib.sha256(f"format={FORMAT}\n".encode())
    for dist in distributions:
        digest.update(f"{canonical(dist.metadata['Name'])}=={dist.version}\n".encode())
    if editable_digest:
        digest.update(f"source={editable_digest}\n".encode())
    return (
        f"gpulayer-{gpulayer_version}-{_interpreter_tag()}-{host_platform_tag()}-"
        f"{digest.hexdigest()[:12]}"
    )


def _summary(files: list[WheelFile]) -> tuple[str, str]:
    specific = [tag.split("-") for wheel in files for tag in wheel.tags]
    python_tag = _interpreter_tag() if any(abi != "none" for _, abi, _ in specific) else "py3"
    pure = all(plat == "any" for _, _, plat in specific)
    return python_tag, "any" if pure else host_platform_tag()


def _load(directory: Path) -> Wheelhouse | None:
    try:
        data = json.loads((directory / MANIFEST).read_text())
        if data.get("format") != FORMAT:
            return None
        files = tuple(
            WheelFile(
                name=f["name"],
                size=int(f["size"]),
                sha256=f["sha256"],
                distribution=f["distribution"],
                version=f["version"],
                tags=tuple(f["tags"]),
            )
            for f in data["files"]
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    for wheel in files:
        path = directory / wheel.name
        if not path.is_file() or path.stat().st_size != wheel.size:
            return None
    return Wheelhouse(
        path=directory,
        python_tag=str(data["python_tag"]),
        platform=str(data["platform"]),
        files=files,
        key=str(data["key"]),
        gpulayer_version=str(data["gpulayer_version"]),
        python_version=str(data["python_version"]),
    )


def build_wheelhouse(
    cache_dir: Path | None = None,
    *,
    exclude: Iterable[str] = SERVER_ONLY,
    on_progress: Callable[[str], None] | None = None,
) -> Wheelhouse:
    """The wheelhouse for this controller's gpulayer, built on first use and then reused.

    Kept in ``$GPULAYER_WHEELHOUSE_DIR`` when set (the user's setting wins), else in
    ``cache_dir``, else in :func:`default_cache_dir`'s user cache, shared by every
    GPULAYER_HOME. One process builds a given wheelhouse at a time (a file lock); the others
    wait and take it. ``on_progress`` hears what is built, with the time spent, at least every
    few seconds (None: a status line on a terminal, else the log)."""
    if os.environ.get(WHEELHOUSE_DIR_ENV) or cache_dir is None:
        cache_dir = default_cache_dir()
    cache_dir = Path(cache_dir)
    distributions = worker_distributions(exclude=exclude)
    root = next(d for d in distributions if canonical(d.metadata["Name"]) == ROOT_DISTRIBUTION)
    editable = editable_source(root) is not None or is_link_only_install(root)
    try:
        installer = metadata.distribution(INSTALLER_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise WheelhouseError(
            "pip is not installed here; the wheelhouse carries pip to install with"
        ) from None
    everything = sorted(
        {canonical(d.metadata["Name"]): d for d in [*distributions, installer]}.items()
    )
    key = wheelhouse_key(
        [d for _, d in everything], editable_digest=source_digest() if editable else None
    )
    target = cache_dir / key
    cached = _load(target)
    if cached is not None:
        return cached
    cache_dir.mkdir(parents=True, exist_ok=True)
    lock = cache_dir / f".{key}.lock"
    with (
        BuildProgress(on_progress) as progress,
        held(lock, progress, f"the worker's wheelhouse {key}"),
    ):
        cached = _load(target)  # another process may have built it meanwhile
        if cached is not None:
            progress.say(f"the worker's wheelhouse {key} was built by another process")
            return cached
        _build(cache_dir, target, key, everything, root, editable, progress)
    loaded = _load(target)
    if loaded is None:
        raise WheelhouseError(f"the wheelhouse at {target} is incomplete after building it")
    return loaded


def _build(
    cache_dir: Path,
    target: Path,
    key: str,
    everything: list[tuple[str, metadata.Distribution]],
    root: metadata.Distribution,
    editable: bool,
    progress: BuildProgress,
) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=cache_dir))
    try:
        files = []
        for number, (name, dist) in enumerate(everything, start=1):
            progress.say(
                f"building the worker's wheelhouse {key} (once per version and platform): "
                f"{number}/{len(everything)} {name}"
            )
            if name == ROOT_DISTRIBUTION and editable:
                files.append(build_from_source(dist, staging))
            elif name == INSTALLER_DISTRIBUTION:
                files.append(build_pip_runner(dist, staging))
            else:
                files.append(repack_distribution(dist, staging))
        python_tag, platform_tag = _summary(files)
        manifest = {
            "format": FORMAT,
            "key": key,
            "gpulayer_version": root.version,
            "python_version": _python_version(),
            "python_tag": python_tag,
            "platform": platform_tag,
            "glibc": "-".join(_platform.libc_ver()) or None,
            "editable": editable,
            "files": [wheel.__dict__ | {"tags": list(wheel.tags)} for wheel in files],
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        staging.chmod(0o755)
        _publish(staging, target)
        _prune(cache_dir, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    progress.say(f"built the worker's wheelhouse {key}")


KEEP_WHEELHOUSES = 3
"""Older wheelhouses in a cache dir are removed: a changing source tree makes a new one each
time, and hosts keep their copy of the one they were given."""

_STALE_STAGING_SECONDS = 3600


def _prune(cache_dir: Path, keep: Path) -> None:
    built = sorted(
        (p for p in cache_dir.glob("gpulayer-*") if p.is_dir() and p != keep),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in built[KEEP_WHEELHOUSES - 1 :]:
        shutil.rmtree(old, ignore_errors=True)
        (cache_dir / f".{old.name}.lock").unlink(missing_ok=True)
    # Staging dirs of builds that died half-way (a crash, kill -9).
    now = time.time()
    for staging in cache_dir.glob(".gpulayer-*"):
        with contextlib.suppress(OSError):
            if now - staging.stat().st_mtime > _STALE_STAGING_SECONDS:
                shutil.rmtree(staging, ignore_errors=True)


def _publish(staging: Path, target: Path) -> None:
    """Move a finished wheelhouse into place. Another process may have finished the same one
    first (theirs is as good as ours) or left a broken one behind (replaced)."""
    try:
        os.rename(staging, target)
        return
    except OSError:
        if _load(target) is not None:
            shutil.rmtree(staging, ignore_errors=True)
            return
    shutil.rmtree(target, ignore_errors=True)
    os.rename(staging, target)
