"""What of an attempt's output folder is uploaded: regular files within a size cap.

A job may leave anything in GPULAYER_OUTPUT_DIR. A symbolic link can point anywhere on the
worker (its credential, another job's files), a fifo blocks whoever reads it, a device is not
data; none of them is an output. Each one passed over is named in a line of the job's log.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from gpulayer.protocol.job_files import file_kind, not_own_file

DEFAULT_MAX_FILE_BYTES = 10 * 1024**3


@dataclass
class OutputFiles:
    files: list[tuple[str, Path]] = field(default_factory=list)
    """(path relative to the output folder, path on disk) of each file to upload."""
    skipped: list[str] = field(default_factory=list)
    """One line per entry passed over, saying why."""


def _kind(mode: int) -> str | None:
    """None for what is uploaded or walked (files, folders), else what it is, in words."""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return file_kind(mode)


def gather_outputs(root: Path, *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> OutputFiles:
    """Walk root without following links; never opens anything but regular files."""
    found = OutputFiles()
    if not root.is_dir() or root.is_symlink():
        return found
    # The job's files are its uid's, as the folder is: another owner's file got there by a
    # hard link (where the kernel allows linking others' files) and is not the job's to send.
    owner = root.lstat().st_uid
    pending = [root]
    while pending:
        directory = pending.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as exc:
            found.skipped.append(f"{directory.relative_to(root).as_posix()}: {exc.strerror}")
            continue
        for entry in entries:
            path = Path(entry.path)
            relative = path.relative_to(root).as_posix()
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # gone meanwhile
            if stat.S_ISDIR(info.st_mode):
                pending.append(path)
                continue
            kind = _kind(info.st_mode)
            if kind is not None:
                found.skipped.append(f"{relative}: {kind}")
            elif info.st_uid != owner:
                found.skipped.append(f"{relative}: {not_own_file(info.st_uid)}")
            elif info.st_size > max_file_bytes:
                found.skipped.append(
                    f"{relative}: {info.st_size} bytes, over the {max_file_bytes} byte cap"
                )
            else:
                found.files.append((relative, path))
    found.files.sort()
    return found
