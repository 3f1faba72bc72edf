"""The dead-man switch fires once after silence, and only records in tests."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from gpulayer.errors import UsageError
from gpulayer.protocol.deadman import DeadmanAction
from gpulayer.worker.deadman import DeadmanSwitch


def test_action_parsing() -> None:
    assert DeadmanAction.parse("poweroff").kind == "poweroff"
    assert DeadmanAction.parse("stop").kind == "stop"
    assert DeadmanAction.parse("record:/tmp/x").record_path == Path("/tmp/x")
    for bad in ("reboot", "record:", ""):
        with pytest.raises(UsageError, match="--deadman-action"):
            DeadmanAction.parse(bad)


def test_fires_after_silence_ends_jobs_records_and_stops(tmp_path: Path) -> None:
    record = tmp_path / "deadman.jsonl"
    ended, stopped = threading.Event(), threading.Event()
    switch = DeadmanSwitch(
        0.5,
        DeadmanAction.parse(f"record:{record}"),
        end_jobs=ended.set,
        stop_worker=stopped.set,
        worker_name="w1",
    )
    switch.start()
    assert stopped.wait(10)
    assert ended.is_set() and switch.fired
    entry = json.loads(record.read_text().strip())
    assert entry["worker"] == "w1" and entry["silent_seconds"] >= 0.5


def test_contact_keeps_it_quiet(tmp_path: Path) -> None:
    stopped = threading.Event()
    switch = DeadmanSwitch(
        0.6,
        DeadmanAction.parse(f"record:{tmp_path / 'r'}"),
        end_jobs=lambda: None,
        stop_worker=stopped.set,
    )
    switch.start()
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        switch.contact()
        time.sleep(0.1)
    assert not stopped.is_set() and not (tmp_path / "r").exists()
    switch.close()
