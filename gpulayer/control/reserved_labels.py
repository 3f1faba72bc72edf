"""Labels under ``gpulayer.`` are the control plane's own: it sets them on the jobs it makes
(an array's id, index and limit; a schedule's name and tick) and acts on them (an array's
limit holds its jobs back, a schedule's label counts a job as its run). A client that could
send them could stall an array (``gpulayer.array.limit=0``), hold another array's jobs back,
or pass a job off as a schedule's run, so a submitted spec may not carry any of them."""

from __future__ import annotations

from typing import Any

RESERVED_PREFIX = "gpulayer."


def reserved_label_lines(spec_data: Any, where: str = "") -> list[str]:
    """One line per reserved label the spec data carries, naming it (``where`` says which
    job of the request: ``jobs[2].``)."""
    labels = spec_data.get("labels") if isinstance(spec_data, dict) else None
    if not isinstance(labels, dict):
        return []
    return [
        f"{where}labels.{key}: reserved: only the server sets {RESERVED_PREFIX}* labels "
        "(an array is made with `submit --array`)"
        for key in labels
        if isinstance(key, str) and key.startswith(RESERVED_PREFIX)
    ]
