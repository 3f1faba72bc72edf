"""A private copy of files a job names, read with the job's own rights.

A more privileged process acting for a job (the worker installing its packages as root) must
read nothing the job itself could not: by the time it reads, a folder of the job's may have
become a link to another job's private folder. So the job's files are read by a process that
runs as the job's uid (GNU tar, which stores a link as a link and never follows it), streamed
to the worker and written into a folder only the worker can reach, keeping plain files and
folders alone, within bounds. What the privileged process reads afterwards is that copy, and
the sha256 of each of its files is known from the bytes written.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import tarfile
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from gpulayer.errors import GpulayerError
from gpulayer.worker.process import RunAs

MAX_BYTES = 16 << 30
MAX_MEMBERS = 20_000
TIMEOUT_SECONDS = 600.0


class JobCopyError(GpulayerError):
    """The job's files could not be copied: the message names the field and why."""


@dataclass(frozen=True)
class Wanted:
    field: str
    """The spec field that names the path, for messages (``setup.find_links``)."""
    path: str
    """Relative to the job's folder, as the spec wrote it."""


def copy_as_job(
    source: Path,
    wanted: Sequence[Wanted],
    dest: Path,
    *,
    run_as: RunAs | None,
    max_bytes: int = MAX_BYTES,
    max_members: int = MAX_MEMBERS,
    timeout: float = TIMEOUT_SECONDS,
) -> dict[str, str]:
    """Copy ``source/path`` of each wanted path into ``dest`` (a new folder, the worker's
    alone), read as ``run_as`` (the worker's own user when None). Returns relative path ->
    sha256 of every file copied. A link, a device or a pipe anywhere is refused."""
    dest.mkdir(mode=0o700)
    if not wanted:
        return {}
    names = [PurePosixPath(w.path).as_posix() for w in wanted]
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(
            ["tar", "--create", "--file=-", "--directory", str(source), "--", *names],
            cwd="/",  # the job's folders are entered by tar itself, as the job's user
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errors,
            close_fds=True,
            start_new_session=True,
            env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
            user=run_as.uid if run_as is not None else None,
            group=run_as.gid if run_as is not None else None,
            extra_groups=[] if run_as is not None else None,
        )
        timer = threading.Timer(timeout, process.kill)
        timer.start()
        unreadable: tarfile.TarError | None = None
        digests: dict[str, str] = {}
        try:
            assert process.stdout is not None
            digests = _unpack(process.stdout, wanted, dest, max_bytes, max_members)
        except tarfile.TarError as exc:  # tar stopped early: its own message says why
            unreadable = exc
            process.kill()
        except BaseException:
            process.kill()
            raise
        finally:
            timer.cancel()
            if process.stdout is not None:
                process.stdout.close()
            code = process.wait()
        if code != 0:
            errors.seek(0)
            said = errors.read(4096).decode(errors="replace").strip().splitlines()
            why = said[0].removeprefix("tar: ") if said else f"exit {code}"
            raise JobCopyError(f"{_field_of(wanted, why)}: cannot be read as the job's user: {why}")
        if unreadable is not None:
            raise JobCopyError(f"{_field_of(wanted, '')}: cannot be copied: {unreadable}")
    return digests


def _field_of(wanted: Sequence[Wanted], text: str) -> str:
    for item in wanted:
        if item.path in text:
            return f"{item.field}: {item.path!r}"
    return ", ".join(sorted({w.field for w in wanted}))


def _owner(name: str, wanted: Sequence[Wanted]) -> Wanted | None:
    path = PurePosixPath(name)
    for item in wanted:
        top = PurePosixPath(item.path)
        if path == top or top in path.parents:
            return item
    return None


def _unpack(
    stream: object, wanted: Sequence[Wanted], dest: Path, max_bytes: int, max_members: int
) -> dict[str, str]:
    digests: dict[str, str] = {}
    total = 0
    with tarfile.open(fileobj=stream, mode="r|") as tar:  # type: ignore[call-overload]
        for count, member in enumerate(tar, start=1):
            name = PurePosixPath(member.name)
            item = _owner(member.name, wanted)
            if item is None or name.is_absolute() or ".." in name.parts:
                raise JobCopyError(f"{member.name!r}: not one of the paths the job named")
            label = f"{item.field}: {item.path!r}"
            if count > max_members:
                raise JobCopyError(f"{label}: holds more than {max_members} entries")
            target = dest / name
            if member.isdir():
                target.mkdir(mode=0o700, parents=True, exist_ok=True)
                continue
            if not member.isreg():
                kind = "a link" if member.issym() or member.islnk() else "not a plain file"
                where = "is" if name == PurePosixPath(item.path) else f"holds {member.name!r},"
                raise JobCopyError(f"{label} {where} {kind}; only files and folders are taken")
            total += member.size
            if total > max_bytes:
                raise JobCopyError(f"{label}: more than {max_bytes} bytes")
            extracted = tar.extractfile(member)
            assert extracted is not None
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            digest = hashlib.sha256()
            with os.fdopen(os.open(target, flags, 0o600), "wb") as out:
                for chunk in iter(functools.partial(extracted.read, 1 << 20), b""):
                    digest.update(chunk)
                    out.write(chunk)
            digests[name.as_posix()] = digest.hexdigest()
    return digests
