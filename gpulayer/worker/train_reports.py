"""Rank 0's ``gl.train.report`` lines as the job wrote them, read back by the worker.

Each report is appended to a file in the attempt's control folder the moment it is made, so a
run that ends without returning (cancelled, timed out, killed) still has its reports to show.
The job owns that file and the folders above it up to the attempt's: it is opened with
:func:`gpulayer.protocol.job_files.open_job_file` (no link followed at any step, nothing but a
regular file), read within a size bound, and a line that is not a JSON object is passed over.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import JsonValue

from gpulayer.protocol.job_files import JobFileError, open_job_file

REPORTS_FILE = "train-reports.jsonl"
REPORTS_VARIABLE = "GPULAYER_TRAIN_REPORTS"
MAX_REPORT_BYTES = 4 * 1024 * 1024


def read_reports(
    root: Path, relative: str, *, max_bytes: int = MAX_REPORT_BYTES
) -> list[JsonValue]:
    """The reports in ``root/relative`` (``root`` being a folder the job cannot replace)."""
    try:
        with open_job_file(root, relative) as (stream, _):
            # Only the first max_bytes: the reports made before the bound still count.
            data = stream.read(max_bytes)
    except JobFileError:
        return []  # none, or not a file of reports
    reports: list[JsonValue] = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue  # cut off by the bound, or not written by gl.train.report
        if isinstance(item, dict):
            reports.append(item)
    return reports
