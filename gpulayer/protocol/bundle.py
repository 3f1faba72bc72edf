"""Source bundles: a job's source directory as a deterministic tar.gz, and safe unpacking.

The same tree always gives the same bytes (sorted entries, fixed times, owners and modes, a
gzip header without a time or name), so a bundle's sha256 identifies its content and can
be cached by workers.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import heapq
import io
import os
import re
import stat
import tarfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from gpulayer.errors import UsageError

# The ignore rules live in bundle_ignore; re-exported here, where callers have always found them.
from gpulayer.protocol.bundle_ignore import DEFAULT_EXCLUDES as DEFAULT_EXCLUDES
from gpulayer.protocol.bundle_ignore import GIT_IGNORE_FILE as GIT_IGNORE_FILE
from gpulayer.protocol.bundle_ignore import IGNORE_FILE as IGNORE_FILE
from gpulayer.protocol.bundle_ignore import IgnoreRules as IgnoreRules
from gpulayer.protocol.bundle_ignore import is_ignored as is_ignored
from gpulayer.protocol.bundle_ignore import parse_ignore as parse_ignore

DEFAULT_MAX_BYTES = 512 * 1024 * 1024
# 1980-01-01, the earliest time a zip can hold: every tool accepts it, and it is not 0,
# which some tools read as "unknown".
BUNDLE_MTIME = 315532800


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
    changed: tuple[str, ...] = ()
    """Files whose size changed while they were bundled: taken as they were read."""
    vanished: tuple[str, ...] = ()
    """Files removed while bundling: left out."""


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# --- never bundled; local inputs (the ignore rules are in bundle_ignore) --------------------

# Never bundled, whatever a rule says: a repository's internals (a .git file too, as in a
# worktree) hold its whole history and often credentials in its config.
NEVER_BUNDLED = frozenset({".git"})
SHIPPED_INPUTS_DIR = ".gpulayer-inputs"
"""Where a bundle carries the job's local inputs, one folder per input's index, for a machine
that cannot read them where they lie."""
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def is_machine_path(artifact: str) -> bool:
    """Whether an input's artifact names a file or folder of the submitting machine (a path,
    or file://), which only its bundle can carry to another machine."""
    if artifact.startswith("job:"):
        return False
    match = _SCHEME_RE.match(artifact)
    return match is None or match.group(1).lower() == "file"


def shipped_input_indexes(bundle: Path | bytes) -> set[int]:
    """The inputs (by index) a bundle (a file, or its bytes) carries under SHIPPED_INPUTS_DIR,
    read from its member names alone."""
    found: set[int] = set()
    prefix = SHIPPED_INPUTS_DIR + "/"
    name = "the bundle" if isinstance(bundle, bytes) else bundle.name
    try:
        with contextlib.ExitStack() as stack:
            stream = stack.enter_context(
                io.BytesIO(bundle) if isinstance(bundle, bytes) else bundle.open("rb")
            )
            tar = stack.enter_context(tarfile.open(fileobj=stream, mode="r|*"))
            for member in tar:
                member_name = member.name.removeprefix("./")
                if member_name.startswith(prefix):
                    rest = member_name[len(prefix) :]
                    index = rest.split("/", 1)[0]
                    if index.isascii() and index.isdigit() and "/" in rest:
                        found.add(int(index))
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise BundleError(f"bundle: cannot read {name}: {exc}") from exc
    return found


def local_input_paths(artifacts: Sequence[str], base: Path) -> dict[int, Path]:
    """The inputs (by index) that are files or folders of this machine and exist now; relative
    ones are read against ``base``, the submit folder."""
    found: dict[int, Path] = {}
    for index, artifact in enumerate(artifacts):
        if artifact.startswith("job:"):
            continue
        match = _SCHEME_RE.match(artifact)
        if match and match.group(1).lower() != "file":
            continue
        local = artifact[len("file://") :] if match else artifact
        path = Path(local).expanduser()
        path = path if path.is_absolute() else base / path
        if path.exists():
            found[index] = path
    return found


def missing_local_inputs(artifacts: Sequence[str], base: Path) -> dict[int, Path]:
    """The inputs (by index) that name a file or folder of this machine (no scheme, or
    file://) that does not exist; relative ones are read against ``base``."""
    missing: dict[int, Path] = {}
    present = local_input_paths(artifacts, base)
    for index, artifact in enumerate(artifacts):
        match = _SCHEME_RE.match(artifact)
        if artifact.startswith("job:") or index in present:
            continue
        if match and match.group(1).lower() != "file":
            continue
        local = artifact[len("file://") :] if match else artifact
        path = Path(local).expanduser()
        missing[index] = path if path.is_absolute() else base / path
    return missing


def shipped_input(work_dir: Path, index: int) -> Path | None:
    """The copy of input ``index`` that its bundle carried, if any."""
    path = work_dir / SHIPPED_INPUTS_DIR / str(index)
    if not path.is_dir():
        return None
    children = list(path.iterdir())
    return children[0] if len(children) == 1 else None


# --- creating -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    rel: str
    path: Path
    kind: str  # "dir", "file" or "link"
    size: int
    executable: bool
    link_target: str = ""


@dataclass
class _Changes:
    """Files that were being written or removed while they were bundled."""

    changed: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)


def _walk(
    src_dir: Path, rules: IgnoreRules, skip: set[Path], changes: _Changes
) -> Iterator[_Entry]:
    """Entries to bundle, less those at ``skip`` (the bundle itself when written into the
    source, the gpulayer home). Directory links are stored as links, not followed. What
    vanishes meanwhile is noted, not an error."""
    root = src_dir.resolve()
    skip_names = {p.name for p in skip}
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            with os.scandir(src_dir / rel_dir) as scan:
                names = sorted(e.name for e in scan)
        except (FileNotFoundError, NotADirectoryError):
            changes.vanished.append(rel_dir + "/")
            continue
        if rel_dir:
            rules.add_gitignore(src_dir / rel_dir, rel_dir)
        subdirs = []
        for name in names:
            if name in NEVER_BUNDLED:
                continue
            rel = f"{rel_dir}/{name}" if rel_dir else name
            path = src_dir / rel
            try:
                st = path.lstat()
            except FileNotFoundError:
                changes.vanished.append(rel)
                continue
            if name in skip_names and path.resolve() in skip:
                continue
            if stat.S_ISLNK(st.st_mode):
                if rules.ignored(rel, path.is_dir()):
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
                if not rules.ignored(rel, True):
                    yield _Entry(rel, path, "dir", 0, False)
                    subdirs.append(rel)
            elif stat.S_ISREG(st.st_mode) and not rules.ignored(rel, False):
                yield _Entry(rel, path, "file", st.st_size, bool(st.st_mode & 0o111))
            # Sockets, fifos and devices are not source; they are skipped.
        stack.extend(reversed(subdirs))


def _shipped_entries(inputs: Mapping[int, Path]) -> Iterator[_Entry]:
    """The local inputs as bundle entries: every file as it is, no ignore rules (the job named
    them), links inside a folder kept only when they stay in it."""
    if inputs:
        yield _Entry(SHIPPED_INPUTS_DIR, Path(), "dir", 0, False)
    for index, path in sorted(inputs.items()):
        top = f"{SHIPPED_INPUTS_DIR}/{index}"
        yield _Entry(top, path, "dir", 0, False)
        rel = f"{top}/{path.name or 'input'}"
        if path.is_file():
            st = path.stat()
            yield _Entry(rel, path, "file", st.st_size, bool(st.st_mode & 0o111))
            continue
        yield _Entry(rel, path, "dir", 0, False)
        for root, dirs, files in os.walk(path):
            dirs.sort()
            here = Path(root)
            inner = here.relative_to(path).as_posix()
            base = rel if inner == "." else f"{rel}/{inner}"
            for name in dirs:
                if not (here / name).is_symlink():
                    yield _Entry(f"{base}/{name}", here / name, "dir", 0, False)
            for name in sorted(files):
                file = here / name
                st = file.lstat()
                if stat.S_ISREG(st.st_mode):
                    executable = bool(st.st_mode & 0o111)
                    yield _Entry(f"{base}/{name}", file, "file", st.st_size, executable)


def _biggest(entries: list[_Entry], count: int = 5) -> list[tuple[str, int]]:
    """Largest top-level entries (a directory counts with all it holds): what to exclude."""
    totals: dict[str, int] = {}
    for entry in entries:
        top, sep, _ = entry.rel.partition("/")
        key = top + "/" if sep else top
        totals[key] = totals.get(key, 0) + entry.size
    return heapq.nlargest(count, totals.items(), key=lambda kv: (kv[1], kv[0]))


def _tarinfo(entry: _Entry, size: int = 0) -> tarfile.TarInfo:
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
        info.size = size
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


class _AsRead(io.RawIOBase):
    """Exactly ``size`` bytes of a file that another process may be writing: bytes appended
    after it was opened are left out, and a file cut short meanwhile is padded with zeros, so
    the archive stays whole. ``short`` tells whether that happened."""

    def __init__(self, source: io.BufferedReader, size: int) -> None:
        self._source = source
        self._left = size
        self.short = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        want = min(len(buffer), self._left)
        if want == 0:
            return 0
        data = self._source.read(want)
        if len(data) < want:
            self.short = True
            data += bytes(want - len(data))
        buffer[: len(data)] = data
        self._left -= len(data)
        return len(data)


def create_bundle(
    src_dir: Path,
    dest: Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    exclude: Iterable[Path] = (),
    inputs: Mapping[int, Path] | None = None,
) -> BundleInfo:
    """Write ``src_dir`` as a tar.gz to ``dest``, leaving out .git, the ``exclude`` paths
    (the gpulayer home), the default excludes and what .gitignore and .gpulayerignore name.
    Raises BundleTooLargeError before writing anything when the files add up to more than
    ``max_bytes``. Files that grow, shrink or vanish meanwhile are taken as they were read
    and named in ``BundleInfo.changed``/``vanished``. ``inputs`` (index -> local file or
    folder) travel under SHIPPED_INPUTS_DIR, counted against the same limit."""
    if not src_dir.is_dir():
        raise BundleError(f"source: {src_dir} is not a directory")
    changes = _Changes()
    skip = {dest.resolve(), *(p.resolve() for p in exclude)}
    # Depth-first, each directory's entries by name: the order `tar` lists.
    walk = _walk(src_dir, IgnoreRules(src_dir), skip, changes)
    entries = sorted(walk, key=lambda e: e.rel.split("/"))
    if any(e.rel.split("/")[0] == SHIPPED_INPUTS_DIR for e in entries):
        entries = [e for e in entries if e.rel.split("/")[0] != SHIPPED_INPUTS_DIR]
    entries += list(_shipped_entries(inputs or {}))
    total = sum(e.size for e in entries)
    if total > max_bytes:
        raise BundleTooLargeError(total, max_bytes, _biggest(entries))
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    files = 0
    written = 0
    try:
        with partial.open("wb") as raw:
            hashing = _HashingWriter(raw)
            with (
                gzip.GzipFile(filename="", mode="wb", fileobj=hashing, mtime=0) as gz,
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
            ):
                for entry in entries:
                    if entry.kind != "file":
                        tar.addfile(_tarinfo(entry))
                        continue
                    try:
                        source = entry.path.open("rb")
                    except FileNotFoundError:
                        changes.vanished.append(entry.rel)
                        continue
                    with source:
                        size = os.fstat(source.fileno()).st_size
                        reader = _AsRead(source, size)
                        tar.addfile(_tarinfo(entry, size), reader)
                    if reader.short or size != entry.size:
                        changes.changed.append(entry.rel)
                    files += 1
                    written += size
        os.replace(partial, dest)
    finally:
        partial.unlink(missing_ok=True)
    return BundleInfo(
        path=dest,
        sha256=hashing.digest.hexdigest(),
        files=files,
        bytes=written,
        changed=tuple(changes.changed),
        vanished=tuple(changes.vanished),
    )


def bundle_warning(info: BundleInfo, *, shown: int = 5) -> str | None:
    """One line naming what changed or vanished while bundling, or None."""

    def listed(names: tuple[str, ...]) -> str:
        more = f" and {len(names) - shown} more" if len(names) > shown else ""
        return ", ".join(names[:shown]) + more

    parts = []
    if info.changed:
        parts.append(f"taken as read while being written: {listed(info.changed)}")
    if info.vanished:
        parts.append(f"left out, removed while bundling: {listed(info.vanished)}")
    return "source: " + "; ".join(parts) if parts else None


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


@dataclass(frozen=True)
class BundleLimits:
    """How far a bundle may expand when it is unpacked: its files' bytes, its members, and
    the ratio of those bytes to the archive's (a gzip bomb expands a thousandfold). Checked on
    each member's header, before its data is read or written."""

    max_bytes: int = DEFAULT_MAX_BYTES
    max_members: int = 200_000
    max_ratio: float = 200.0
    ratio_floor_bytes: int = 64 * 1024 * 1024
    """Below this many expanded bytes any ratio passes: a small archive of zeros is no bomb."""

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> BundleLimits:
        """The defaults, less what GPULAYER_MAX_BUNDLE_{BYTES,MEMBERS,RATIO} say."""
        environ = os.environ if environ is None else environ
        base = cls()
        values: dict[str, float] = {}
        for field_name, variable, kind in (
            ("max_bytes", BUNDLE_BYTES_VARIABLE, int),
            ("max_members", BUNDLE_MEMBERS_VARIABLE, int),
            ("max_ratio", BUNDLE_RATIO_VARIABLE, float),
        ):
            text = environ.get(variable, "").strip()
            if not text:
                continue
            try:
                value = kind(text)
            except ValueError:
                value = 0
            if not value >= 1:
                raise UsageError(f"{variable}: a number of at least 1, not {text!r}")
            values[field_name] = value
        return replace(base, **values)  # type: ignore[arg-type]


BUNDLE_BYTES_VARIABLE = "GPULAYER_MAX_BUNDLE_BYTES"
BUNDLE_MEMBERS_VARIABLE = "GPULAYER_MAX_BUNDLE_MEMBERS"
BUNDLE_RATIO_VARIABLE = "GPULAYER_MAX_BUNDLE_RATIO"


class BundleOverLimitError(BundleError):
    """A bundle would expand past one of its limits."""


def _bounded_members(
    tar: tarfile.TarFile, compressed: int, limits: BundleLimits
) -> list[tarfile.TarInfo]:
    """The archive's members, read header by header; refused as soon as the count or the
    bytes their headers declare pass a limit (before any of that data is expanded)."""
    members: list[tarfile.TarInfo] = []
    expanded = 0
    while True:
        member = tar.next()
        if member is None:
            return members
        members.append(member)
        if len(members) > limits.max_members:
            raise BundleOverLimitError(
                f"bundle: more than {limits.max_members} members "
                f"({BUNDLE_MEMBERS_VARIABLE} raises the limit)"
            )
        expanded += max(member.size, 0) if member.isfile() else 0
        if expanded > limits.max_bytes:
            raise BundleOverLimitError(
                f"bundle: its files would expand to more than {_human(limits.max_bytes)} "
                f"({BUNDLE_BYTES_VARIABLE} raises the limit)"
            )
        if expanded > limits.ratio_floor_bytes and expanded > limits.max_ratio * max(compressed, 1):
            raise BundleOverLimitError(
                f"bundle: its {_human(compressed)} would expand more than {limits.max_ratio:g} "
                f"times, past {_human(expanded)} (a compression bomb; "
                f"{BUNDLE_RATIO_VARIABLE} raises the limit)"
            )


def check_archive(path: Path, limits: BundleLimits | None = None) -> int:
    """Raise BundleError unless ``path`` is a tar archive every member of which would land
    inside its destination, within ``limits``; returns the number of members. Writes nothing."""
    limits = limits or BundleLimits.from_environment()
    try:
        with tarfile.open(path, mode="r:*") as tar:
            members = _bounded_members(tar, path.stat().st_size, limits)
    except BundleError:
        raise
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise BundleError(f"bundle: {path.name} is not a readable tar archive: {exc}") from exc
    check_members(members)
    return len(members)


def extract_bundle(path: Path, dest: Path, limits: BundleLimits | None = None) -> int:
    """Unpack the bundle at ``path`` into ``dest``; returns the number of members. Every
    member is checked (place, kind, and the limits on what it all expands to) before anything
    is written, and tarfile's data filter guards the writing too where this Python has it."""
    limits = limits or BundleLimits.from_environment()
    dest.mkdir(parents=True, exist_ok=True)
    filter_error: type[Exception] | tuple[()] = getattr(tarfile, "FilterError", ())
    try:
        with tarfile.open(path, mode="r:*") as tar:
            members = _bounded_members(tar, path.stat().st_size, limits)
            check_members(members)
            if hasattr(tarfile, "data_filter"):
                tar.extractall(dest, members=members, filter="data")
            else:  # Python without PEP 706; the checks above stand alone
                tar.extractall(dest, members=members)
    except BundleError:
        raise
    except filter_error as exc:
        raise UnsafeBundleError(f"bundle: {exc}") from exc
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise BundleError(f"bundle: cannot unpack {path.name}: {exc}") from exc
    return len(members)
