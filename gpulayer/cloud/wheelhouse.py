"""The worker's install set for a machine that cannot reach a package index.

Built offline from what this controller runs: every distribution the worker needs (gpulayer
and the closure of its runtime requirements, markers evaluated, server-only packages left
out) is repacked from its installed files into a wheel, and pip's wheel is added, with its
bytecode, to run in place, so the host can install without having pip. Repacking reads a
distribution's RECORD (the list of files pip installed), zips those files with their
.dist-info and takes the wheel tags from its WHEEL file; console scripts are left out
because pip writes them again at install time.

gpulayer itself, when installed editable, has only a .pth file in its RECORD. Its wheel is
then made from the source tree instead: the package directory (without bytecode caches) plus
a .dist-info holding the installed METADATA and entry points, a generated WHEEL and RECORD.

Wheelhouses are cached under ``cache_dir/<key>``; the key names the gpulayer version, the
python and platform tags, and a digest of every distribution's name and version (and of the
source tree for an editable gpulayer), so any change builds a new one. Zips are written
deterministically, so an unchanged distribution gives a byte-identical wheel and a host that
already has it need not receive it again.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import platform as _platform
import re
import shutil
import sys
import sysconfig
import tempfile
import time
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path, PurePosixPath

from gpulayer.errors import GpulayerError

FORMAT = 2
MANIFEST = "wheelhouse.json"
ROOT_DISTRIBUTION = "gpulayer"
INSTALLER_DISTRIBUTION = "pip"

SERVER_ONLY = frozenset({"fastapi", "starlette", "uvicorn", "sqlalchemy", "paramiko", "croniter"})
"""Never imported by a worker: the control plane (FastAPI, SQLAlchemy, cron schedules) and the
controller's SSH side. Their own dependencies are left out with them unless something the
worker needs requires them too."""

_SKIPPED_DIST_INFO = frozenset({"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"})
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_(.+)$")


class WheelhouseError(GpulayerError):
    """The wheelhouse cannot be built or read."""


class DistributionNotRepackable(WheelhouseError):
    """An installed distribution lacks what a wheel is made from (RECORD, WHEEL) or a file its
    RECORD lists."""


@dataclass(frozen=True)
class WheelFile:
    name: str
    """The file name, ``{distribution}-{version}-{tags}.whl``."""
    size: int
    sha256: str
    """Hex digest of the whole file."""
    distribution: str
    version: str
    tags: tuple[str, ...]
    """Every ``python-abi-platform`` tag the WHEEL file lists."""


@dataclass(frozen=True)
class Wheelhouse:
    path: Path
    python_tag: str
    """``cp311`` when some wheel is built for one interpreter version, else ``py3``."""
    platform: str
    """``linux_x86_64`` when some wheel is built for one platform, else ``any``."""
    files: tuple[WheelFile, ...]
    key: str = ""
    gpulayer_version: str = ""
    python_version: str = ""
    """The controller's ``major.minor``."""

    def file(self, name: str) -> WheelFile:
        for entry in self.files:
            if entry.name == name:
                return entry
        raise KeyError(name)

    def incompatibility(
        self,
        host_python_version: str,
        host_platform: str,
        *,
        glibc: str | None = None,
        implementation: str = "cpython",
    ) -> str | None:
        """Why these wheels cannot be installed on the host, or None when they can.

        ``host_platform`` is the host's wheel platform tag (``linux_x86_64``: sysconfig's
        platform with '-' and '.' as '_'); ``glibc`` its C library version (``2.36``), None
        when unknown, in which case manylinux wheels are taken to fit any glibc."""
        return incompatibility(
            self.files,
            host_python_version,
            host_platform,
            glibc=glibc,
            implementation=implementation,
        )

    def compatible(
        self,
        host_python_version: str,
        host_platform: str,
        *,
        glibc: str | None = None,
        implementation: str = "cpython",
    ) -> bool:
        return (
            self.incompatibility(
                host_python_version, host_platform, glibc=glibc, implementation=implementation
            )
            is None
        )


# --- compatibility (pure) -------------------------------------------------------------------------


def _version_pair(text: str, what: str) -> tuple[int, int]:
    match = re.match(r"^(\d+)\.(\d+)", text.strip())
    if not match:
        raise ValueError(f"{what}: {text!r} is not a version such as 3.11.7")
    return int(match.group(1)), int(match.group(2))


def _python_fits(interpreter: str, abi: str, py: tuple[int, int], implementation: str) -> bool:
    major, minor = py
    if interpreter.startswith("py"):
        digits = interpreter[2:]
        if digits == str(major):
            return True
        return digits.startswith(str(major)) and digits[1:].isdigit() and int(digits[1:]) <= minor
    if interpreter.startswith("cp") and implementation == "cpython":
        digits = interpreter[2:]
        if not digits.isdigit() or not digits.startswith(str(major)) or len(digits) < 2:
            return False
        wanted = int(digits[len(str(major)) :])
        # abi3 wheels run on their version and every later one; others on their version only.
        return wanted <= minor if abi == "abi3" else wanted == minor
    return False


def _abi_fits(abi: str, py: tuple[int, int], implementation: str) -> bool:
    if abi in ("none", "abi3"):
        return abi == "none" or implementation == "cpython"
    return implementation == "cpython" and abi == f"cp{py[0]}{py[1]}"


def _platform_fits(tag: str, host: str, glibc: tuple[int, int] | None) -> bool:
    if tag == "any" or tag == host:
        return True
    if not host.startswith("linux_"):
        return False
    arch = host[len("linux_") :]
    for legacy, needed in _LEGACY_MANYLINUX.items():
        if tag == f"{legacy}_{arch}":
            return glibc is None or glibc >= needed
    match = _MANYLINUX.match(tag)
    if match and match.group(3) == arch:
        return glibc is None or glibc >= (int(match.group(1)), int(match.group(2)))
    return False


def tag_fits(
    tag: str,
    host_python_version: str,
    host_platform: str,
    *,
    glibc: str | None = None,
    implementation: str = "cpython",
) -> bool:
    """Whether one ``python-abi-platform`` wheel tag installs on the host."""
    parts = tag.split("-")
    if len(parts) != 3:
        return False
    interpreter, abi, plat = parts
    py = _version_pair(host_python_version, "host_python_version")
    libc = _version_pair(glibc, "glibc") if glibc else None
    return (
        _python_fits(interpreter, abi, py, implementation)
        and _abi_fits(abi, py, implementation)
        and _platform_fits(plat, host_platform, libc)
    )


def incompatibility(
    files: Iterable[WheelFile],
    host_python_version: str,
    host_platform: str,
    *,
    glibc: str | None = None,
    implementation: str = "cpython",
) -> str | None:
    """The first wheel that does not fit the host, said in one line; None when all fit."""
    for wheel in files:
        if not any(
            tag_fits(
                tag,
                host_python_version,
                host_platform,
                glibc=glibc,
                implementation=implementation,
            )
            for tag in wheel.tags
        ):
            host = f"{implementation} {host_python_version} on {host_platform}"
            if glibc:
                host += f" (glibc {glibc})"
            return (
                f"{wheel.name} does not install on {host}: it is built for "
                f"{', '.join(wheel.tags)}; the worker's wheels come from this controller, "
                "so the host needs the controller's python version and platform"
            )
    return None


def host_platform_tag(raw: str | None = None) -> str:
    """``linux-x86_64`` (sysconfig's form) as a wheel platform tag: ``linux_x86_64``."""
    return (raw or sysconfig.get_platform()).replace("-", "_").replace(".", "_")


# --- requirements closure -------------------------------------------------------------------------


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def worker_distributions(
    root: str = ROOT_DISTRIBUTION, *, exclude: Iterable[str] = SERVER_ONLY
) -> list[metadata.Distribution]:
    """``root`` and every installed distribution its requirements reach, markers evaluated
    for this interpreter, without following ``exclude``. Sorted by name."""
    from packaging.requirements import InvalidRequirement, Requirement

    excluded = {canonical(name) for name in exclude}
    found: dict[str, metadata.Distribution] = {}
    extras_seen: dict[str, set[str]] = {}
    pending: list[tuple[str, frozenset[str], str]] = [(root, frozenset(), "")]
    while pending:
        name, extras, needed_by = pending.pop()
        key = canonical(name)
        if key in found and extras <= extras_seen[key]:
            continue
        try:
            dist = found.get(key) or metadata.distribution(name)
        except metadata.PackageNotFoundError:
            by = f"{needed_by} requires it" if needed_by else "it is the worker's package"
            raise WheelhouseError(
                f"{name} is not installed here ({by}); install it on the controller"
            ) from None
        found[key] = dist
        extras_seen.setdefault(key, set()).update(extras)
        environments = [{"extra": extra} for extra in sorted(extras_seen[key] | {""})]
        for line in dist.requires or []:
            try:
                requirement = Requirement(line)
            except InvalidRequirement as exc:
                raise WheelhouseError(f"{dist.metadata['Name']}: bad requirement {line!r}") from exc
            if canonical(requirement.name) in excluded:
                continue
            marker = requirement.marker
            if marker is not None and not any(marker.evaluate(env) for env in environments):
                continue
            pending.append(
                (requirement.name, frozenset(requirement.extras), str(dist.metadata["Name"]))
            )
    return [found[key] for key in sorted(found)]


# --- repacking ---------------------------------------------------------------------------------


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _dist_info_dir(dist: metadata.Distribution) -> Path:
    path = getattr(dist, "_path", None)
    if path is None or not str(path).endswith(".dist-info"):
        raise DistributionNotRepackable(
            f"{dist.metadata['Name']} is not installed as a .dist-info (an egg or a system "
            "package?); reinstall it with pip on the controller"
        )
    return Path(path)


def _wheel_tags(dist: metadata.Distribution) -> tuple[list[str], str | None]:
    text = dist.read_text("WHEEL")
    name = dist.metadata["Name"]
    if text is None:
        raise DistributionNotRepackable(
            f"{name} has no WHEEL file in its .dist-info, so its wheel tags are unknown; "
            "reinstall it with pip on the controller"
        )
    tags: list[str] = []
    build = None
    for line in text.splitlines():
        field, _, value = line.partition(":")
        if field.strip() == "Tag":
            tags.append(value.strip())
        elif field.strip() == "Build":
            build = value.strip()
    if not tags:
        raise DistributionNotRepackable(f"{name}: its WHEEL file lists no Tag")
    return tags, build


def _compressed_tag(tags: list[str]) -> str:
    columns: list[list[str]] = [[], [], []]
    for tag in tags:
        for column, part in zip(columns, tag.split("-"), strict=True):
            if part not in column:
                column.append(part)
    return "-".join(".".join(column) for column in columns)


def wheel_name(name: str, version: str, tags: list[str], build: str | None = None) -> str:
    """``pydantic_core-2.46.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl``."""
    parts = [canonical(name).replace("-", "_"), version.replace("-", "_")]
    if build:
        parts.append(build)
    return "-".join([*parts, _compressed_tag(tags)]) + ".whl"


def _script_names(dist: metadata.Distribution) -> set[str]:
    return {ep.name for ep in dist.entry_points if ep.group in ("console_scripts", "gui_scripts")}


def _is_cache(parts: tuple[str, ...]) -> bool:
    return "__pycache__" in parts or parts[-1].endswith((".pyc", ".pyo"))


def _installed_members(dist: metadata.Distribution) -> Iterator[tuple[str, Path]]:
    """(path inside the wheel, file on disk) for each file the distribution's RECORD lists."""
    name = str(dist.metadata["Name"])
    files = dist.files
    if files is None:
        raise DistributionNotRepackable(
            f"{name} has no RECORD, so which files it installed is unknown; "
            "reinstall it with pip on the controller"
        )
    info_dir = _dist_info_dir(dist)
    site = Path(str(dist.locate_file(""))).resolve()
    scripts = Path(sysconfig.get_path("scripts")).resolve()
    data_root = Path(sysconfig.get_path("data")).resolve()
    data_prefix = f"{info_dir.name[: -len('.dist-info')]}.data"
    entry_scripts = _script_names(dist)
    for entry in files:
        parts = PurePosixPath(str(entry)).parts
        if not parts or _is_cache(parts):
            continue
        on_disk = Path(str(dist.locate_file(entry))).resolve()
        if parts[0] == info_dir.name and parts[-1] in _SKIPPED_DIST_INFO and len(parts) == 2:
            continue
        if parts[0] != "..":
            arcname = "/".join(parts)
        elif on_disk.parent == scripts:
            if on_disk.name in entry_scripts:
                continue  # pip writes console scripts again from entry_points.txt
            arcname = f"{data_prefix}/scripts/{on_disk.name}"
        elif on_disk.is_relative_to(data_root):
            arcname = f"{data_prefix}/data/{on_disk.relative_to(data_root).as_posix()}"
        else:
            raise DistributionNotRepackable(f"{name}: cannot place installed file {on_disk}")
        if not on_disk.is_file():
            raise DistributionNotRepackable(
                f"{name}: {on_disk} is listed in its RECORD but missing; reinstall {name}"
            )
        if parts[0] != ".." and not on_disk.is_relative_to(site):
            # A .pth-style link out of site-packages; the target is not part of the wheel.
            continue
        yield arcname, on_disk


def _script_bytes(arcname: str, data: bytes) -> bytes:
    # Installed scripts start with this interpreter's path; a wheel says "#!python" and pip
    # writes the host's interpreter in its place.
    if "/scripts/" in arcname and data.startswith(b"#!") and b"python" in data.split(b"\n", 1)[0]:
        rest = data.split(b"\n", 1)[1] if b"\n" in data else b""
        return b"#!python\n" + rest
    return data


@dataclass(frozen=True)
class WheelFileBody:
    size: int
    sha256: str


def _write_wheel(
    destination: Path, members: list[tuple[str, bytes]], info_dir_name: str
) -> WheelFileBody:
    """Write a deterministic wheel: sorted members, fixed timestamps, RECORD last."""
    record_name = f"{info_dir_name}/RECORD"
    rows = []
    members = sorted(members, key=lambda m: m[0])
    with zipfile.ZipFile(destination, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for arcname, data in members:
            _add(archive, arcname, data, executable="/scripts/" in arcname)
            rows.append(f"{arcname},{_record_hash(data)},{len(data)}")
        rows.append(f"{record_name},,")
        _add(archive, record_name, ("\n".join(rows) + "\n").encode())
    body = destination.read_bytes()
    return WheelFileBody(len(body), hashlib.sha256(body).hexdigest())


def _add(archive: zipfile.ZipFile, arcname: str, data: bytes, *, executable: bool = False) -> None:
    info = zipfile.ZipInfo(arcname, date_time=_ZIP_TIME)
    info.external_attr = (0o755 if executable else 0o644) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    archive.writestr(info, data)


def repack_distribution(dist: metadata.Distribution, directory: Path) -> WheelFile:
    """Zip an installed distribution back into a wheel in ``directory``."""
    tags, build = _wheel_tags(dist)
    info_dir = _dist_info_dir(dist)
    members = [
        (arcname, _script_bytes(arcname, path.read_bytes()))
        for arcname, path in _installed_members(dist)
    ]
    name = str(dist.metadata["Name"])
    if not any(arcname.startswith(f"{info_dir.name}/METADATA") for arcname, _ in members):
        raise DistributionNotRepackable(f"{name}: its RECORD does not list METADATA")
    filename = wheel_name(name, dist.version, tags, build)
    body = _write_wheel(directory / filename, members, info_dir.name)
    return WheelFile(filename, body.size, body.sha256, name, dist.version, tuple(tags))


def editable_source(dist: metadata.Distribution) -> Path | None:
    """The source tree of an editable install (pip's direct_url.json says so), else None."""
    text = dist.read_text("direct_url.json")
    if not text:
        return None
    try:
        info = json.loads(text)
    except ValueError:
        return None
    if not info.get("dir_info", {}).get("editable"):
        return None
    url = str(info.get("url", ""))
    return Path(url.removeprefix("file://")) if url.startswith("file://") else None


def _package_dir() -> Path:
    import gpulayer

    return Path(gpulayer.__file__).resolve().parent


def _package_files(package: Path) -> list[Path]:
    files = []
    for path in sorted(package.rglob("*")):
        relative = path.relative_to(package.parent)
        if path.is_file() and not _is_cache(relative.parts) and not path.name.startswith("."):
            files.append(path)
    return files


def source_digest(package: Path | None = None) -> str:
    """Digest of the package's files (names and contents): an editable gpulayer's identity."""
    package = package or _package_dir()
    digest = hashlib.sha256()
    for path in _package_files(package):
        digest.update(path.relative_to(package.parent).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def build_from_source(dist: metadata.Distribution, directory: Path) -> WheelFile:
    """gpulayer's wheel from its package directory, for an editable install (see above)."""
    package = _package_dir()
    info_dir = _dist_info_dir(dist)
    tag = "py3-none-any"
    members: list[tuple[str, bytes]] = [
        (path.relative_to(package.parent).as_posix(), path.read_bytes())
        for path in _package_files(package)
    ]
    metadata_text = dist.read_text("METADATA")
    if metadata_text is None:
        raise DistributionNotRepackable(f"{dist.metadata['Name']}: no METADATA to repack")
    members.append((f"{info_dir.name}/METADATA", metadata_text.encode()))
    entry_points = dist.read_text("entry_points.txt")
    if entry_points:
        members.append((f"{info_dir.name}/entry_points.txt", entry_points.encode()))
    wheel = (
        f"Wheel-Version: 1.0\nGenerator: gpulayer-wheelhouse\nRoot-Is-Purelib: true\nTag: {tag}\n"
    )
    members.append((f"{info_dir.name}/WHEEL", wheel.encode()))
    name = str(dist.metadata["Name"])
    filename = wheel_name(name, dist.version, [tag])
    body = _write_wheel(directory / filename, members, info_dir.name)
    return WheelFile(filename, body.size, body.sha256, name, dist.version, (tag,))


def _unchecked_pyc(source: bytes, filename: str) -> bytes:
    """Bytecode that zipimport loads without comparing it to its source (PEP 552)."""
    import importlib.util
    import marshal

    code = compile(source, filename, "exec", dont_inherit=True)
    flags = (0b01).to_bytes(4, "little")  # hash-based, not checked against the source
    return (
        importlib.util.MAGIC_NUMBER
        + flags
        + importlib.util.source_hash(source)
        + (marshal.dumps(code))
    )


def build_pip_runner(dist: metadata.Distribution, directory: Path) -> WheelFile:
    """pip's wheel with each module's bytecode beside it, for python to run in place
    (``python pip-....whl/pip install ...``), so a host needs no pip of its own. Run from a
    zip, pip would otherwise compile its modules on every start, a second of CPU per host. A
    python of another version ignores the bytecode and compiles as before; installed, the
    extra files are ignored too, since python reads bytecode from __pycache__."""
    info_dir = _dist_info_dir(dist)
    members: list[tuple[str, bytes]] = []
    for arcname, path in _installed_members(dist):
        data = path.read_bytes()
        members.append((arcname, data))
        if arcname.endswith(".py") and not arcname.startswith(f"{info_dir.name}/"):
            with contextlib.suppress(SyntaxError, ValueError):
                members.append((arcname[:-3] + ".pyc", _unchecked_pyc(data, arcname)))
    # Named as the wheel it also is, so pip, finding itself on sys.path, reads it as one.
    tags, build = _wheel_tags(dist)
    filename = wheel_name(str(dist.metadata["Name"]), dist.version, tags, build)
    body = _write_wheel(directory / filename, members, info_dir.name)
    return WheelFile(
        filename,
        body.size,
        body.sha256,
        str(dist.metadata["Name"]),
        dist.version,
        ("py3-none-any",),
    )


# --- the cached wheelhouse ----------------------------------------------------------------------


def default_cache_dir() -> Path:
    from gpulayer.cloud.cache import default_cache_dir as cache_root

    return cache_root("wheelhouse")


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
    cache_dir: Path | None = None, *, exclude: Iterable[str] = SERVER_ONLY
) -> Wheelhouse:
    """The wheelhouse for this controller's gpulayer, built on first use and then reused."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    distributions = worker_distributions(exclude=exclude)
    root = next(d for d in distributions if canonical(d.metadata["Name"]) == ROOT_DISTRIBUTION)
    editable = editable_source(root) is not None or _record_is_link_only(root)
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
    staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=cache_dir))
    try:
        files = []
        for name, dist in everything:
            if name == ROOT_DISTRIBUTION and editable:
                files.append(build_from_source(dist, staging))
            elif dist is installer:
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
    loaded = _load(target)
    if loaded is None:
        raise WheelhouseError(f"the wheelhouse at {target} is incomplete after building it")
    return loaded


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


def _record_is_link_only(dist: metadata.Distribution) -> bool:
    """An editable install by other means: its RECORD holds no module of the package."""
    files = dist.files or []
    return not any(
        str(f).endswith(".py") and not str(f).startswith("..") and "dist-info" not in str(f)
        for f in files
    )
