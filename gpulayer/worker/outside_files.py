"""Files a job writes outside $GPULAYER_OUTPUT_DIR: kept as outputs when ``outputs.paths``
names them, and named at the job's end when a rented machine is about to delete them.

The job's working folder is the job's, not the worker's: a name in it may be a symbolic link or
a hard link to a file the job may not read (the worker's credential, the machine's keys). So
the folder is walked without following links, only regular files are taken, each opened with
O_NOFOLLOW and checked to be the file that was listed, and, where jobs run as a user of their
own, owned by that user. What is passed over is named, never read.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

MAX_LISTED = 100_000
"""Files looked at in one working folder, at most: a folder of millions is not walked whole."""
_SKIPPED_DIRS = frozenset({"__pycache__", ".git"})
_NAMED_IN_NOTE = 5

Snapshot = dict[str, tuple[int, int]]
"""Relative path -> (size, mtime in ns) of each regular file."""


@dataclass
class Kept:
    copied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """One line each: the path and why it was not kept."""


def _walk(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of every regular file under ``root``, links never followed."""
    listed = 0
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode):
                if entry.name not in _SKIPPED_DIRS:
                    stack.append(Path(entry.path))
                continue
            listed += 1
            if listed > MAX_LISTED:
                return
            yield Path(entry.path).relative_to(root).as_posix(), info


def snapshot(root: Path) -> Snapshot:
    return {
        relative: (info.st_size, info.st_mtime_ns)
        for relative, info in _walk(root)
        if stat.S_ISREG(info.st_mode)
    }


def _matcher(patterns: Sequence[str]) -> object:
    import pathspec

    return pathspec.GitIgnoreSpec.from_lines(patterns)


def after_run(
    root: Path,
    patterns: Sequence[str],
    output_dir: Path,
    owner_uid: int | None,
    before: Snapshot | None,
    say: Callable[[str], None],
) -> None:
    """Keep what ``patterns`` match; with the folder as it was before the job (``before``,
    taken on a rented machine only), name what the job leaves to be deleted."""
    kept = keep_matching(root, patterns, output_dir, owner_uid=owner_uid)
    for line in kept.skipped:
        say(f"outputs.paths: skipped {line}")
    if before is not None:
        left = left_behind(root, before, patterns)
        if left:
            say(deletion_note(left))


def keep_matching(
    root: Path,
    patterns: Sequence[str],
    output_dir: Path,
    *,
    owner_uid: int | None = None,
) -> Kept:
    """Copy the files under ``root`` that ``patterns`` match into ``output_dir`` at their
    relative paths; a file the job wrote there itself wins over one of the same path."""
    kept = Kept()
    if not patterns:
        return kept
    spec = _matcher(patterns)
    for relative, info in sorted(_walk(root)):
        if not spec.match_file(relative):  # type: ignore[attr-defined]
            continue
        why = _refusal(info, owner_uid)
        if why is None:
            why = _copy(root / relative, info, output_dir, relative)
        if why is None:
            kept.copied.append(relative)
        else:
            kept.skipped.append(f"{relative}: {why}")
    return kept


def _refusal(info: os.stat_result, owner_uid: int | None) -> str | None:
    if stat.S_ISLNK(info.st_mode):
        return "a symbolic link, not followed"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if owner_uid is not None and info.st_uid != owner_uid:
        return "not the job's own file"
    return None


def _copy(source: Path, listed: os.stat_result, output_dir: Path, relative: str) -> str | None:
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    try:
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (listed.st_dev, listed.st_ino):
            return "replaced while it was read"
        try:
            out = _create_below(output_dir, relative)
        except FileExistsError:
            return "the job wrote that path under $GPULAYER_OUTPUT_DIR too; that one is kept"
        with os.fdopen(fd, "rb", closefd=False) as reader, os.fdopen(out, "wb") as writer:
            shutil.copyfileobj(reader, writer, 1 << 20)
    except OSError as exc:
        return f"cannot be copied ({exc.strerror})"
    finally:
        os.close(fd)
    return None


def _create_below(root: Path, relative: str) -> int:
    """A new file at ``root/relative``, every folder on the way opened without following a
    link: the output folder is the job's, and a link it planted there must not carry the
    worker's writes elsewhere."""
    *folders, name = relative.split("/")
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    current = os.open(root, flags)
    try:
        for folder in folders:
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder, 0o755, dir_fd=current)
            following = os.open(folder, flags, dir_fd=current)
            os.close(current)
            current = following
        create = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        return os.open(name, create, 0o644, dir_fd=current)
    finally:
        os.close(current)


def left_behind(root: Path, before: Snapshot, patterns: Sequence[str]) -> list[tuple[str, int]]:
    """(relative path, size) of the files the job wrote or changed under ``root`` that no
    pattern keeps, largest first."""
    spec = _matcher(patterns) if patterns else None
    found = []
    for relative, (size, mtime) in snapshot(root).items():
        if before.get(relative) == (size, mtime):
            continue
        if spec is not None and spec.match_file(relative):  # type: ignore[attr-defined]
            continue
        found.append((relative, size))
    return sorted(found, key=lambda item: (-item[1], item[0]))


def deletion_note(files: Sequence[tuple[str, int]]) -> str:
    """The line a job on a rented machine ends with when it leaves files to be deleted."""
    count = len(files)
    named = ", ".join(f"{path} ({human_size(size)})" for path, size in files[:_NAMED_IN_NOTE])
    more = f" and {count - _NAMED_IN_NOTE} more" if count > _NAMED_IN_NOTE else ""
    verb = "is" if count == 1 else "are"
    noun = "file" if count == 1 else "files"
    return (
        f"note: {count} {noun} written outside $GPULAYER_OUTPUT_DIR {verb} deleted with the "
        f"machine: {named}{more}; see outputs.paths"
    )


def human_size(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in ("KB", "MB", "GB", "TB"):
        value /= 1024
        if value < 1024 or unit == "TB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")
