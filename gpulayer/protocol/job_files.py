"""Opening a file that a job wrote, from a worker or control plane with more rights than it.

Whatever lies in a job's folders is the job's to choose: a symbolic link to a root-only file
(the worker would hand over what the job may not read), a fifo (the reader blocks until
someone writes), a device such as /dev/zero (endless). A file is therefore opened one
component at a time below a folder the job cannot replace, never following a link
(``O_NOFOLLOW`` at every step), never waiting (``O_NONBLOCK``), and only kept if it is a regular
file; readers bound what they take by the size seen at open.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Literal

from gpulayer.errors import GpulayerError

_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


Refusal = Literal["missing", "too_big", "refused"]


class JobFileError(GpulayerError):
    """A file a job wrote that the reader will not take (its message says why)."""

    def __init__(self, message: str, refusal: Refusal = "refused") -> None:
        super().__init__(message)
        self.refusal: Refusal = refusal


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a fifo"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file"


def not_own_file(uid: int) -> str:
    return f"not the job's own file (its owner is uid {uid})"


def _parts(relative: str) -> tuple[str, ...]:
    parts = PurePosixPath(relative).parts
    if not parts or parts[0] == "/" or any(part in ("..", ".") for part in parts):
        raise JobFileError(f"{relative}: leaves its folder")
    return parts


def _refusal(relative: str, exc: OSError) -> JobFileError:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        # O_NOFOLLOW answers ELOOP for a link; O_DIRECTORY answers ENOTDIR for a link to
        # a file where a folder was expected.
        return JobFileError(f"{relative}: a symbolic link (or a file where a folder should be)")
    if exc.errno == errno.ENOENT:
        return JobFileError(f"{relative}: does not exist", "missing")
    return JobFileError(f"{relative}: cannot be opened ({exc.strerror})")


@contextlib.contextmanager
def open_job_file(root: Path, relative: str) -> Iterator[tuple[BinaryIO, os.stat_result]]:
    """The regular file at ``root/relative`` opened for reading, with what fstat saw at open.

    ``root`` itself is opened without following a link; its parents are trusted (a job must
    not be able to replace them). The file must have ``root``'s owner (the job's uid): one of
    another owner got there through a hard link and is not the job's to hand over."""
    parts = _parts(relative)
    try:
        folder = os.open(root, _DIRECTORY_FLAGS)
    except OSError as exc:
        raise _refusal(str(root), exc) from None
    owner = os.fstat(folder).st_uid
    try:
        for part in parts[:-1]:
            inner = os.open(part, _DIRECTORY_FLAGS, dir_fd=folder)
            os.close(folder)
            folder = inner
        fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=folder)
    except OSError as exc:
        raise _refusal(relative, exc) from None
    finally:
        os.close(folder)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise JobFileError(f"{relative}: not a regular file ({file_kind(info.st_mode)})")
    if info.st_uid != owner:
        os.close(fd)
        raise JobFileError(f"{relative}: {not_own_file(info.st_uid)}")
    os.set_blocking(fd, True)
    with os.fdopen(fd, "rb") as stream:
        yield stream, info


def read_job_file(root: Path, relative: str, *, limit: int) -> bytes:
    """The whole content of a regular file a job wrote, refused when over ``limit`` bytes."""
    with open_job_file(root, relative) as (stream, info):
        if info.st_size > limit:
            raise JobFileError(
                f"{relative}: {info.st_size} bytes, more than the {limit} byte limit", "too_big"
            )
        data = stream.read(limit + 1)
    if len(data) > limit:  # it grew after the open
        raise JobFileError(f"{relative}: more than the {limit} byte limit", "too_big")
    return data


def copy_job_file(root: Path, relative: str, target: BinaryIO, *, limit: int) -> int:
    """Copy a regular file a job wrote into ``target``: at most the size it had at open (and
    never more than ``limit`` bytes); returns how many bytes were copied."""
    with open_job_file(root, relative) as (stream, info):
        size = info.st_size
        if size > limit:
            raise JobFileError(f"{relative}: {size} bytes, over the {limit} byte cap", "too_big")
        left = size
        while left:
            chunk = stream.read(min(left, 1 << 20))
            if not chunk:
                break  # it shrank meanwhile: what was there is what is kept
            target.write(chunk)
            left -= len(chunk)
    return size - left


def root_of(relative: str, path: Path) -> Path:
    """The folder that ``relative`` is relative to, given the full ``path`` of the file."""
    root = path
    for _ in PurePosixPath(relative).parts:
        root = root.parent
    return root
