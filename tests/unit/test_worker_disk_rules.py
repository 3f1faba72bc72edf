"""The worker's disk rules on real folders: which ended attempts a sweep removes, and how the
bundle limits read their environment variables."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpulayer.errors import UsageError
from gpulayer.protocol.bundle import BundleLimits
from gpulayer.worker.disk import attempt_folders, disk_trouble, sweep_attempt_folders


def attempt(root: Path, job: str, number: int, ended_at: float) -> Path:
    folder = root / job / f"attempt-{number}"
    (folder / "work").mkdir(parents=True)
    (folder / "work" / "f.txt").write_text("x")
    os.utime(folder, (ended_at, ended_at))
    return folder


def test_a_sweep_removes_ended_attempts_past_their_hours_only(tmp_path: Path) -> None:
    now = 1_000_000.0
    old = attempt(tmp_path, "j1", 1, now - 7200)
    recent = attempt(tmp_path, "j2", 1, now - 60)
    live = attempt(tmp_path, "j3", 1, now - 9999)
    (tmp_path / "outside").symlink_to(tmp_path / "j2")  # a link is no job folder of the worker
    removed = sweep_attempt_folders(tmp_path, 3600, {live}, now=now)
    assert removed == 1
    assert not old.exists() and not (tmp_path / "j1").exists()  # its empty job folder went too
    assert recent.exists() and live.exists()
    assert sorted(attempt_folders(tmp_path)) == sorted([recent, live])


def test_without_keep_every_ended_attempt_goes(tmp_path: Path) -> None:
    attempt(tmp_path, "j1", 1, 5.0)
    attempt(tmp_path, "j1", 2, 6.0)
    assert sweep_attempt_folders(tmp_path, 0, set(), now=6.0) == 2
    assert list(tmp_path.iterdir()) == []


def test_a_roomy_folder_is_not_degraded(tmp_path: Path) -> None:
    assert disk_trouble(tmp_path) is None
    assert disk_trouble(tmp_path / "missing") is None  # cannot tell: preparing will say


def test_bundle_limits_read_their_variables_and_refuse_nonsense() -> None:
    limits = BundleLimits.from_environment(
        {"GPULAYER_MAX_BUNDLE_BYTES": "1000", "GPULAYER_MAX_BUNDLE_RATIO": "50.5"}
    )
    assert (limits.max_bytes, limits.max_members, limits.max_ratio) == (1000, 200_000, 50.5)
    for name, bad in (("GPULAYER_MAX_BUNDLE_MEMBERS", "0"), ("GPULAYER_MAX_BUNDLE_RATIO", "x")):
        with pytest.raises(UsageError, match=name):
            BundleLimits.from_environment({name: bad})
