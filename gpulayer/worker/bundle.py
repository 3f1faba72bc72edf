"""Source bundles: a job's source directory as a deterministic tar.gz, and safe unpacking.

The same tree always gives the same bytes (sorted entries, fixed times, owners and modes, a
gzip header without a time or name), so a bundle's sha256 identifies its content and can
be cached by workers.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import heapq
import io
import os
import stat
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from gpulayer.errors import UsageError

IGNORE_FILE = ".gpulayerignore"
DEFAULT_MAX_BYTES = 512 * 1024 * 1024
# 1980-01-01, the earliest time a zip can hold: every tool accepts it, and it is not 0,
# which some tools read as "unknown".
BUNDLE_MTIME = 315532800

DEFAULT_EXCLUDES: tuple[str, ...] = (
    ".git/",
    "__pycache__/",
    "*.pyc",
    ".venv/",
    "venv/",
    "node_modules/",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
)


class BundleError(UsageError):
    """A source bundle could not be made or unpacked: the caller's directory or archive."""


class BundleTooLargeError(BundleError):
    """The source directory holds more than the bundle limit."""

    def __init__(self, size: int, limit: int, biggest: list[tuple[str, int]]) -> None:
        listed = ", ".join(f"{name} ({_human(n)})" for name, n in biggest)
        super().__init__(
            f"source: {_human(size)} is more than the {_human(limit)} bundle limit; "
            f"biggest entries: {listed}; exclude them in {IGNORE_FILE}"
        )
        self.size = size
        self.limit = limit
        self.biggest = biggest


class UnsafeBundleError(BundleError):
    """A bundle member would land outside the destination or is not a plain file, directory
    or link within the bundle."""


@dataclass(frozen=True)
class BundleInfo:
    path: Path
    sha256: str
    files: int
    bytes: int
    """Total size of the files bundled, before compression."""


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# --- ignore rules ---------------------------------------------------------------------------


@dataclass(frozen=True)
class IgnoreRule:
    pattern: str
    negate: bool
    dir_only: bool
    anchored: bool
    """The pattern holds a '/': it matches the path from the root, not any basename."""


def parse_ignore(lines: Iterable[str]) -> list[IgnoreRule]:
    """gitignore-like rules: '#' comments, '!' re-includes, a trailing '/' matches only
    directories, a pattern with a '/' is matched against the whole relative path, one without
    against each name. The last matching rule wins."""
    rules = []
    for raw in lines:
        line = raw.rstrip("\n\r").rstrip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        anchored = "/" in line
        line = line.lstrip("/")
        if line:
            rules.append(IgnoreRule(line, negate, dir_only, anchored))
    return rules


def is_ignored(rel_path: str, is_dir: bool, rules: Iterable[IgnoreRule]) -> bool:
    name = rel_path.rsplit("/", 1)[-1]
    ignored = False
    for rule in rules:
        if rule.dir_only and not is_dir:
            continue
        subject = rel_path if rule.anchored else name
        if fnmatch.fnmatchcase(subject, rule.pattern):
            ignored = not rule.negate
    return ignored


def load_rules(src_dir: Path) -> list[IgnoreRule]:
    rules = parse_ignore(DEFAULT_EXCLUDES)
    ignore_file = src_dir / IGNORE_FILE
    if ignore_file.is_file():
        rules += parse_ignore(ignore_file.read_text(encoding="utf-8").splitlines())
    return rules


# --- creating -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    rel: str
    path: Path
    kind: str  # "dir", "file" or "link"
    size: int
    executable: bool
    link_target: str = ""


def _walk(src_dir: Path, rules: list[IgnoreRule], skip: Path) -> Iterator[_Entry]:
    """Entries to bundle, less ``skip`` (a bundle written into the source itself). Directory
    links are stored as links, not followed."""
    root = src_dir.resolve()
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(src_dir / rel_dir) as scan:
            names = sorted(e.name for e in scan)
        subdirs = []
        for name in names:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            path = src_dir / rel
            st = path.lstat()
            if name == skip.name and path.resolve() == skip:
                continue
            if stat.S_ISLNK(st.st_mode):
                if is_ignored(rel, path.is_dir(), rules):
                    continue
                target = os.readlink(path)
                resolved = path.resolve()
                if not resolved.is_relative_to(root):
                    raise BundleError(
                        f"source: link {rel} points outside the source directory ({target}); "
                        f"add it to {IGNORE_FILE} or replace it with the files"
                    )
                yield _Entry(rel, path, "link", 0, False, target)
            elif stat.S_ISDIR(st.st_mode):
                if not is_ignored(rel, True, rules):
                    yield _Entry(rel, path, "dir", 0, False)
                    subdirs.append(rel)
            elif stat.S_ISREG(st.st_mode) and not is_ignored(rel, False, rules):
                yield _Entry(rel, path, "file", st.st_size, bool(st.st_mode & 0o111))
            # Sockets, fifos and devices are not source; they are skipped.
        stack.extend(reversed(subdirs))


def _biggest(entries: list[_Entry], count: int = 5) -> list[tuple[str, int]]:
    """Largest top-level entries (a directory counts with all it holds): what to exclude."""
    totals: dict[str, int] = {}
    for entry in entries:
        top, sep, _ = entry.rel.partition("/")
        key = top + "/" if sep else top
        totals[key] = totals.get(key, 0) + entry.size
    return heapq.nlargest(count, totals.items(), key=lambda kv: (kv[1], kv[0]))


def _tarinfo(entry: _Entry) -> tarfile.TarInfo:
    info = tarfile.TarInfo(entry.rel)
    info.mtime = BUNDLE_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if entry.kind == "dir":
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
    elif entry.kind == "link":
        info.type = tarfile.SYMTYPE
        info.linkname = entry.link_target
        info.mode = 0o777
    else:
        info.size = entry.size
        info.mode = 0o755 if entry.executable else 0o644
    return info


class _HashingWriter(io.RawIOBase):
    def __init__(self, target: io.BufferedWriter) -> None:
        self._target = target
        self.digest = hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.digest.update(data)
        return self._target.write(data)


def create_bundle(src_dir: Path, dest: Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> BundleInfo:
    """Write ``src_dir`` as a tar.gz to ``dest``, leaving out the default excludes and the
    patterns of its .gpulayerignore. Raises BundleTooLargeError before writing anything when
    the files add up to more than ``max_bytes``."""
    if not src_dir.is_dir():
        raise BundleError(f"source: {src_dir} is not a directory")
    # Depth-first, each directory's entries by name: the order `tar` lists.
    walk = _walk(src_dir, load_rules(src_dir), skip=dest.resolve())
    entries = sorted(walk, key=lambda e: e.rel.split("/"))
    total = sum(e.size for e in entries)
    if total > max_bytes:
        raise BundleTooLargeError(total, max_bytes, _biggest(entries))
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    files = 0
    try:
        with partial.open("wb") as raw:
            hashing = _HashingWriter(raw)
            with (
                gzip.GzipFile(filename="", mode="wb", fileobj=hashing, mtime=0) as gz,
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
            ):
                for entry in entries:
                    info = _tarinfo(entry)
                    if entry.kind != "file":
                        tar.addfile(info)
                        continue
                    with entry.path.open("rb") as f:
                        # A file that changed size since the walk would corrupt the archive.
                        if os.fstat(f.fileno()).st_size != entry.size:
                            raise BundleError(f"source: {entry.rel} changed while bundling")
                        tar.addfile(info, f)
                    files += 1
        os.replace(partial, dest)
    finally:
        partial.unlink(missing_ok=True)
    return BundleInfo(path=dest, sha256=hashing.digest.hexdigest(), files=files, bytes=total)


# --- unpacking ------------------------------------------------------------------------------


def _stays_inside(base: PurePosixPath, target: PurePosixPath, links: set[str]) -> bool:
    """Whether ``base/target`` (a link's directory and its target) stays in the bundle
    without passing through another link, whose own target would decide where it goes."""
    parts = list(base.parts)
    for part in target.parts:
        if parts and "/".join(parts) in links:
            return False
        if part == "..":
            if not parts:
                return False
            parts.pop()
        elif part != ".":
            parts.append(part)
    return True


def _check_member(member: tarfile.TarInfo, links: set[str], files: set[str]) -> None:
    name = member.name
    posix = PurePosixPath(name)
    if posix.is_absolute() or name.startswith("\\") or (len(name) > 1 and name[1] == ":"):
        raise UnsafeBundleError(f"bundle: member {name!r} has an absolute path")
    if ".." in posix.parts or ".." in name.split("\\"):
        raise UnsafeBundleError(f"bundle: member {name!r} climbs out with '..'")
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        raise UnsafeBundleError(f"bundle: member {name!r} is a device, fifo or other special file")
    # Writing through a link the bundle made would land wherever that link points.
    for parent in posix.parents:
        if parent.as_posix() in links:
            raise UnsafeBundleError(f"bundle: member {name!r} lies under the link {parent}")
    target = PurePosixPath(member.linkname)
    if member.issym() or member.islnk():
        if target.is_absolute():
            raise UnsafeBundleError(f"bundle: link {name!r} points to an absolute path")
        base = posix.parent if member.issym() else PurePosixPath()
        if not _stays_inside(base, target, links):
            raise UnsafeBundleError(f"bundle: link {name!r} points outside the bundle")
    if member.islnk() and target.as_posix() not in files:
        raise UnsafeBundleError(f"bundle: hard link {name!r} is not to a file before it")
    if member.isfile():
        files.add(posix.as_posix())


def check_members(members: list[tarfile.TarInfo]) -> None:
    """Raise UnsafeBundleError unless every member lands inside the destination."""
    links = {PurePosixPath(m.name).as_posix() for m in members if m.issym()}
    files: set[str] = set()
    for member in members:
        _check_member(member, links, files)


def check_archive(path: Path) -> int:
    """Raise BundleError unless ``path`` is a tar archive every member of which would land
    inside its destination; returns the number of members. Writes nothing."""
    try:
        with tarfile.open(path, mode="r:*") as tar:
            members = tar.getmembers()
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise BundleError(f"bundle: {path.name} is not a readable tar archive: {exc}") from exc
    check_members(members)
    return len(members)


def extract_bundle(path: Path, dest: Path) -> int:
    """Unpack the bundle at ``path`` into ``dest``; returns the number of members. Every
    member is checked before anything is written, and tarfile's data filter guards the
    writing too where this Python has it."""
    dest.mkdir(parents=True, exist_ok=True)
    filter_error: type[Exception] | tuple[()] = getattr(tarfile, "FilterError", ())
    try:
        with tarfile.open(path, mode="r:*") as tar:
            members = tar.getmembers()
            check_members(members)
            if hasattr(tarfile, "data_filter"):
                tar.extractall(dest, filter="data")
            else:  # Python without PEP 706; the checks above stand alone
                tar.extractall(dest)
    except filter_error as exc:
        raise UnsafeBundleError(f"bundle: {exc}") from exc
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise BundleError(f"bundle: cannot unpack {path.name}: {exc}") from exc
    return len(members)
