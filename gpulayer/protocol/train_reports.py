"""A Trainer's reports as its log carries them: rank 0 prints each ``gl.train.report`` as one
line, so a control plane can read the reports back from the log of an attempt whose worker
never said how it ended (a machine lost or reclaimed under it)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

REPORT_LINE_PREFIX = "gpulayer.train.report "


def report_line(serialized: str) -> str:
    """The line rank 0 prints for one report (``serialized``: the report's JSON)."""
    return f"{REPORT_LINE_PREFIX}{serialized}"


def reports_in_log(texts: Iterable[str]) -> list[dict[str, Any]]:
    """The reports among an attempt's stdout text, in order; other lines, and report lines cut
    short or not holding a JSON object, are passed over."""
    reports: list[dict[str, Any]] = []
    for text in texts:
        for line in text.splitlines():
            if not line.startswith(REPORT_LINE_PREFIX):
                continue
            try:
                item = json.loads(line[len(REPORT_LINE_PREFIX) :])
            except ValueError:
                continue
            if isinstance(item, dict):
                reports.append(item)
    return reports
