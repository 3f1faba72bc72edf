"""Files a client uploaded before the call that uses them (a source bundle before its submit)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

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
