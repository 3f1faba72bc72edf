"""Reading back the reports a Trainer's rank 0 appended: whole JSON objects only, no links
followed (the file's nor a folder's above it), nothing but a regular file read."""

from __future__ import annotations

import os
from pathlib import Path

from gpulayer.worker.train_reports import read_reports


def test_reports_are_read_in_order_and_a_cut_line_is_passed_over(tmp_path: Path) -> None:
    path = tmp_path / "reports.jsonl"
    path.write_text('{"epoch": 0}\n{"epoch": 1}\n[1, 2]\n{"epoch": 2, "lo')
    assert read_reports(tmp_path, "reports.jsonl") == [{"epoch": 0}, {"epoch": 1}]


def test_no_file_is_no_reports(tmp_path: Path) -> None:
    assert read_reports(tmp_path, "absent.jsonl") == []


def test_a_link_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.jsonl"
    target.write_text('{"secret": 1}\n')
    link = tmp_path / "reports.jsonl"
    link.symlink_to(target)
    assert read_reports(tmp_path, "reports.jsonl") == []


def test_a_folder_swapped_for_a_link_is_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "reports.jsonl").write_text('{"secret": 1}\n')
    attempt = tmp_path / "attempt"
    attempt.mkdir()
    (attempt / ".gpulayer").symlink_to(elsewhere)
    assert read_reports(attempt, ".gpulayer/reports.jsonl") == []


def test_a_fifo_is_not_read(tmp_path: Path) -> None:
    fifo = tmp_path / "reports.jsonl"
    os.mkfifo(fifo)
    assert read_reports(tmp_path, "reports.jsonl") == []


def test_reading_stops_at_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "reports.jsonl"
    path.write_text("".join(f'{{"epoch": {i}}}\n' for i in range(1000)))
    assert 0 < len(read_reports(tmp_path, "reports.jsonl", max_bytes=100)) < 10
