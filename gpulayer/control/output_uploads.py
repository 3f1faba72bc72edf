"""An attempt's outputs as a worker uploads them (a tar.gz), unpacked within limits.

A worker's upload is whatever its job left, so it is bounded like any input from outside: how
many files, how many bytes once expanded, and how far the expansion may outgrow the compressed
upload (a gzip bomb expands a thousandfold). The upload is unpacked as it streams in, so each
limit is checked before the rest of the body is read: the bytes as they expand, and each
member's declared size on its header, so a bomb is refused before its data expands. A refusal
is a 413 naming the limit and the server setting that raises it.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, cast

from gpulayer.errors import GpulayerError, UsageError

FILES_VARIABLE = "GPULAYER_MAX_OUTPUT_FILES"
BYTES_VARIABLE = "GPULAYER_MAX_OUTPUT_BYTES"
RATIO_VARIABLE = "GPULAYER_MAX_OUTPUT_RATIO"
_GZIP_MAGIC = b"\x1f\x8b"
# Small uploads of very compressible files (logs, zero-filled arrays) are let through whatever
# their ratio: a bomb needs to be big to hurt.
RATIO_FLOOR_BYTES = 64 * 1024 * 1024


class UploadTooLarge(GpulayerError):
    """An upload over one of the server's limits (HTTP 413)."""


@dataclass(frozen=True)
class OutputLimits:
    max_files: int = 10_000
    max_bytes: int = 20 * 1024**3
    max_ratio: float = 200.0

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> OutputLimits:
        """The defaults, less what GPULAYER_MAX_OUTPUT_* say."""
        from gpulayer.control.log_cap import parse_byte_size

        environ = os.environ if environ is None else environ
        limits = cls()
        files = environ.get(FILES_VARIABLE)
        size = environ.get(BYTES_VARIABLE)
        ratio = environ.get(RATIO_VARIABLE)
        try:
            return cls(
                max_files=int(files) if files else limits.max_files,
                max_bytes=parse_byte_size(size, BYTES_VARIABLE) if size else limits.max_bytes,
                max_ratio=float(ratio) if ratio else limits.max_ratio,
            ).checked()
        except ValueError as exc:
            raise UsageError(f"GPULAYER_MAX_OUTPUT_*: {exc}") from None

    def checked(self) -> OutputLimits:
        if self.max_files < 1:
            raise UsageError("--max-output-files: must be at least 1")
        if self.max_bytes < 1:
            raise UsageError("--max-output-bytes: must be at least 1")
        if not self.max_ratio >= 1:
            raise UsageError("--max-output-ratio: must be at least 1")
        return self


def receive_within(chunks_total: int, limits: OutputLimits) -> None:
    """Refuse an upload whose compressed bytes so far are already over the expanded cap."""
    if chunks_total > limits.max_bytes:
        raise UploadTooLarge(
            f"outputs: the upload is over the {limits.max_bytes} byte limit "
            "(the server's --max-output-bytes)"
        )


def extract_outputs(upload: BinaryIO, dest: Path, limits: OutputLimits) -> int:
    """Unpack an outputs upload (a tar, gzip-compressed or not) as it is read, member by member,
    within ``limits``; returns the files written. Only regular files and folders are taken, each
    inside ``dest``. A member is refused on its header, before its data is read, when the size it
    declares would take the upload over a limit."""
    dest.mkdir(parents=True, exist_ok=True)
    files = 0
    compressed = _Metered(upload)
    expanded = _Expansion(_decompressed(compressed), compressed, limits)
    try:
        with tarfile.open(fileobj=expanded, mode="r|") as tar:
            for member in tar:
                _check_name(member)
                files += 1
                if files > limits.max_files:
                    raise UploadTooLarge(
                        f"outputs: more than {limits.max_files} files "
                        "(the server's --max-output-files)"
                    )
                expanded.foresee(max(member.size, 0))
                tar.extract(member, dest, filter="data")
    except (UploadTooLarge, UsageError):
        raise
    except (tarfile.TarError, EOFError, OSError, ValueError, zlib.error) as exc:
        raise UsageError(f"outputs: cannot unpack the upload: {exc}") from exc
    return files


class _Metered(io.RawIOBase):
    """The upload as it is read, counting its (compressed) bytes; its first bytes can be peeked."""

    def __init__(self, raw: BinaryIO) -> None:
        super().__init__()
        self._raw = raw
        self._peeked = b""
        self.count = 0

    def readable(self) -> bool:
        return True

    def peek(self, size: int) -> bytes:
        while len(self._peeked) < size:
            more = self._raw.read(size - len(self._peeked))
            if not more:
                break
            self._peeked += more
        return self._peeked[:size]

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        if self._peeked:
            data, self._peeked = self._peeked[: len(target)], self._peeked[len(target) :]
        else:
            data = self._raw.read(len(target))
        target[: len(data)] = data
        self.count += len(data)
        return len(data)


def _decompressed(upload: _Metered) -> BinaryIO:
    if upload.peek(len(_GZIP_MAGIC)) == _GZIP_MAGIC:
        return cast(BinaryIO, gzip.GzipFile(fileobj=upload, mode="rb"))
    return cast(BinaryIO, upload)


class _Expansion(io.RawIOBase):
    """The tar stream inside the upload, checked against the limits as it expands: every byte,
    pax records and long names included, which no member's declared size shows."""

    def __init__(self, expanded: BinaryIO, compressed: _Metered, limits: OutputLimits) -> None:
        super().__init__()
        self._expanded = expanded
        self._compressed = compressed
        self._limits = limits
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        data = self._expanded.read(len(target))
        target[: len(data)] = data
        self.count += len(data)
        self._check(self.count)
        return len(data)

    def foresee(self, declared: int) -> None:
        """Check what the stream will have expanded to once ``declared`` more bytes are read."""
        self._check(self.count + declared)

    def _check(self, expanded: int) -> None:
        if expanded > self._limits.max_bytes:
            raise UploadTooLarge(
                f"outputs: more than {self._limits.max_bytes} bytes once unpacked "
                "(the server's --max-output-bytes)"
            )
        compressed = max(self._compressed.count, 1)
        if expanded > RATIO_FLOOR_BYTES and expanded > self._limits.max_ratio * compressed:
            raise UploadTooLarge(
                f"outputs: they expand more than {self._limits.max_ratio:g} times their "
                "compressed size (the server's --max-output-ratio)"
            )


def _check_name(member: tarfile.TarInfo) -> None:
    posix = PurePosixPath(member.name)
    if posix.is_absolute() or ".." in posix.parts or "\\" in member.name:
        raise UsageError(f"outputs: member {member.name!r} leaves the output folder")
    if not (member.isfile() or member.isdir()):
        raise UsageError(f"outputs: member {member.name!r} is not a regular file or a folder")
