"""An attempt's outputs kept as its job's: the files of the local worker's output folder, or a
remote worker's upload, staged and swapped in only while the attempt is still current."""

from __future__ import annotations

import hashlib
import logging
import shutil
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from gpulayer.control import gangs
from gpulayer.control.auth import Principal
from gpulayer.control.gang_service import GangService
from gpulayer.control.output_uploads import OutputLimits
from gpulayer.control.paths import HomeLayout
from gpulayer.control.store import Store
from gpulayer.control.worker_access import WorkerAccess
from gpulayer.errors import UsageError
from gpulayer.ids import new_id
from gpulayer.protocol.job_files import JobFileError, copy_job_file, root_of

log = logging.getLogger("gpulayer.control")


class OutputKeeper:
    def __init__(
        self,
        store: Store,
        layout: HomeLayout,
        access: WorkerAccess,
        gangs: GangService,
        limits: OutputLimits,
    ) -> None:
        self.store = store
        self.layout = layout
        self.access = access
        self.gangs = gangs
        self.limits = limits
        """What one outputs upload of a remote worker may hold (see output_uploads)."""
        self._lock = threading.Lock()

    def record_outputs(
        self,
        attempt_id: int,
        files: Sequence[tuple[str, Path]],
        caller: Principal | None = None,
    ) -> None:
        """Keep the files an attempt wrote under GPULAYER_OUTPUT_DIR as its job's outputs.

        Only the job's current attempt may: the files are staged first and swapped in while
        the attempt is checked once more, so a stale attempt never replaces a newer one's.
        A gang's node 0 writes the top of the outputs, node r the folder ``node-<r>/``."""
        attempt = self.access.own_attempt(attempt_id, caller)
        node = attempt.node_rank if self.gangs.is_gang(attempt) else None
        staging = self.layout.root / "incoming" / f"outputs-{attempt_id}-{new_id('s')}"
        try:
            entries = _stage(files, staging, attempt_id)
            staging.mkdir(parents=True, exist_ok=True)
            with self._lock:
                self.access.own_attempt(attempt_id, caller)
                destination = self.layout.outputs_dir(attempt.job_id)
                prefix = None
                if node is not None:
                    prefix = gangs.node_output_prefix(node)
                    if prefix:
                        destination = destination / prefix.rstrip("/")
                    else:
                        gangs.carry_node_outputs(destination, staging)
                previous = destination.with_name(destination.name + f".old-{attempt_id}")
                if destination.exists():
                    destination.rename(previous)
                destination.parent.mkdir(parents=True, exist_ok=True)
                staging.rename(destination)
                shutil.rmtree(previous, ignore_errors=True)
                if node is None:
                    self.store.record_artifacts(attempt.job_id, sorted(entries))
                else:
                    self.store.record_node_artifacts(
                        attempt.job_id,
                        sorted((f"{prefix}{p}", s, h) for p, s, h in entries),
                        prefix=prefix or "",
                    )
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def receive_outputs(
        self, attempt_id: int, upload: BinaryIO, caller: Principal | None = None
    ) -> None:
        """A remote worker's outputs, a tar.gz of its output folder, unpacked as it is read;
        nothing of it is kept when it is refused."""
        import tempfile

        from gpulayer.control.output_uploads import extract_outputs

        self.access.own_attempt(attempt_id, caller)
        with tempfile.TemporaryDirectory(dir=self.layout.root) as scratch:
            extract_outputs(upload, Path(scratch), self.limits)
            self.record_outputs(attempt_id, _regular_files(Path(scratch)), caller)


def _stage(
    files: Sequence[tuple[str, Path]], staging: Path, attempt_id: int
) -> list[tuple[str, int, str]]:
    """Copies of ``files`` under ``staging``, each with its size and sha256."""
    entries = []
    for relative, source in files:
        target = staging / relative
        if not target.resolve().is_relative_to(staging.resolve()):
            raise UsageError(f"outputs: {relative!r} leaves the output folder")
        target.parent.mkdir(parents=True, exist_ok=True)
        # The local worker hands over the job's own folder: no link is followed, and a file
        # swapped for one since the worker walked the folder is left out.
        try:
            with target.open("wb") as copy:
                copy_job_file(root_of(relative, source), relative, copy, limit=sys.maxsize)
        except JobFileError as exc:
            target.unlink()
            log.warning("outputs of attempt %s: skipped %s", attempt_id, exc)
            continue
        digest = hashlib.sha256()
        with target.open("rb") as stream:
            for chunk in iter(lambda: stream.read(1 << 20), b""):
                digest.update(chunk)
        entries.append((relative, target.stat().st_size, digest.hexdigest()))
    return entries


def _regular_files(root: Path) -> list[tuple[str, Path]]:
    """Regular files under root (links, fifos and devices are not outputs), by relative path."""
    found = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            found.append((path.relative_to(root).as_posix(), path))
    return found
