"""Reading a Trainer's reports back from its log lines (pure)."""

from __future__ import annotations

import json

from gpulayer.protocol.train_reports import report_line, reports_in_log


def test_report_lines_round_trip_in_order() -> None:
    texts = [report_line(json.dumps({"step": n})) for n in (1, 2, 3)]
    assert reports_in_log(texts) == [{"step": 1}, {"step": 2}, {"step": 3}]


def test_other_lines_and_broken_reports_are_passed_over() -> None:
    texts = [
        "epoch 1 done",
        report_line('{"step": 1}') + "\n" + report_line('{"step": 2}'),  # one row, two lines
        report_line('{"step": 3'),  # cut short
        report_line("[1, 2]"),  # not an object
        "  " + report_line('{"step": 9}'),  # not at the start of a line
    ]
    assert reports_in_log(texts) == [{"step": 1}, {"step": 2}]
