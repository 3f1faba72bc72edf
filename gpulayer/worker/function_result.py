"""The result file a function's shim leaves in its attempt's folder, read by the worker."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import JsonValue

from gpulayer.protocol.job_files import JobFileError, read_job_file

RESULT_LIMIT_BYTES = 16 * 1024 * 1024
"""Bigger return values belong in GPULAYER_OUTPUT_DIR, not in the control plane's store."""


def read_result(root: Path, name: str) -> dict[str, JsonValue] | None:
    """The shim's result file below the attempt's folder, read without following links or
    blocking, within RESULT_LIMIT_BYTES (the job may have put anything there)."""
    relative = f".gpulayer/{name}"
    try:
        raw = read_job_file(root, relative, limit=RESULT_LIMIT_BYTES)
    except JobFileError as exc:
        if exc.refusal == "missing":
            return None
        if exc.refusal == "too_big":
            return {
                "ok": False,
                "error": f"the return value is more than the {RESULT_LIMIT_BYTES} byte "
                "limit; write big results to GPULAYER_OUTPUT_DIR",
            }
        return {"ok": False, "error": f"the result file is refused: {exc}"}
    try:
        payload = json.loads(raw.decode("utf-8"))
    except ValueError as exc:
        return {"ok": False, "error": f"the result file cannot be read: {exc}"}
    if not isinstance(payload, dict) or "ok" not in payload:
        return {"ok": False, "error": "the result file is not one the function shim writes"}
    return payload
