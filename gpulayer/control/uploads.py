"""Files a client uploaded before the call that uses them (a source bundle before its submit)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from gpulayer.control.body_pipe import read_body_on_a_thread
from gpulayer.errors import UsageError

if TYPE_CHECKING:
    from gpulayer.control.service import ControlService


def incoming_bundle(service: ControlService, bundle_id: Any) -> Path | None:
    if bundle_id is None:
        return None
    if not isinstance(bundle_id, str) or "/" in bundle_id or not bundle_id.endswith(".tar.gz"):
        raise UsageError("bundle_id: not a bundle this server handed out")
    path = service.layout.root / "incoming" / bundle_id
    if not path.is_file():
        raise UsageError(f"bundle_id: {bundle_id} was not uploaded (or was used already)")
    return path


async def receive_to_file(chunks: AsyncIterable[bytes], directory: Path, suffix: str) -> Path:
    """The body written to a new file in ``directory`` by a thread of its own (disk writes
    never hold the event loop). Whatever stops it (the disk full, the client gone, the body
    over its cap) removes the file: an upload is kept whole or not at all."""
    directory.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=directory, suffix=suffix)
    path = Path(name)

    def copy(body: BinaryIO) -> None:
        with os.fdopen(handle, "wb") as out:  # closing flushes: a full disk may show only here
            shutil.copyfileobj(body, out, 1 << 20)

    try:
        await read_body_on_a_thread(chunks, copy)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path
