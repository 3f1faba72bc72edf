"""Installed distributions zipped back into wheels.

A distribution's RECORD lists the files pip installed; those files with their .dist-info make
the wheel, and the WHEEL file gives its tags. Console scripts are left out (pip writes them
again at install time), bytecode caches too. Zips are deterministic (sorted members, fixed
timestamps), so an unchanged distribution gives the same bytes every time.

An editable gpulayer has only a .pth file in its RECORD; its wheel is made from the package
directory instead, with a .dist-info of the installed METADATA and entry points and a
generated WHEEL and RECORD. pip's wheel gets each module's bytecode beside it, so pip can run
in place from it on a host without starting slowly.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import sysconfig
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path, PurePosixPath

from gpulayer.cloud.wheelhouse.closure import canonical
from gpulayer.cloud.wheelhouse.errors import DistributionNotRepackable
from gpulayer.cloud.wheelhouse.model import WheelFile

_SKIPPED_DIST_INFO = frozenset({"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"})
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


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
    body = _write_wheel(directory / filename, _with_bytecode(members), info_dir.name)
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
    body = _write_wheel(directory / filename, _with_bytecode(members), info_dir.name)
    return WheelFile(filename, body.size, body.sha256, name, dist.version, (tag,))


def is_link_only_install(dist: metadata.Distribution) -> bool:
    """An editable install by other means: its RECORD holds no module of the package."""
    files = dist.files or []
    return not any(
        str(f).endswith(".py") and not str(f).startswith("..") and "dist-info" not in str(f)
        for f in files
    )


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


def _with_bytecode(members: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """``members`` and, for each module, its bytecode where this python keeps it
    (``__pycache__/NAME.cpython-311.pyc``), not checked against its source: the host installs
    the worker read-only and sealed, so compiling here, once per wheelhouse, spares every host
    the compile, and no python ever writes bytecode into the sealed install. A module that does
    not compile (a package's python 2 leftover) gets none, as with pip's own compile."""
    import sys

    tag = sys.implementation.cache_tag
    compiled = []
    for arcname, data in members:
        parts = arcname.split("/")
        if not arcname.endswith(".py") or parts[0].endswith((".dist-info", ".data")):
            continue
        cached = "/".join([*parts[:-1], "__pycache__", f"{parts[-1][:-3]}.{tag}.pyc"])
        with contextlib.suppress(SyntaxError, ValueError):
            compiled.append((cached, _unchecked_pyc(data, arcname)))
    return members + compiled


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
