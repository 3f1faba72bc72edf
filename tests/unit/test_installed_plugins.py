"""What tells a long-running control plane that the installed distributions changed, and that
one was installed after it started (gpulayer.cloud.installed), on real folders."""

from __future__ import annotations

import os
import sys
import time
from importlib.metadata import EntryPoint, PathDistribution
from pathlib import Path

import pytest

from gpulayer.cloud.installed import installed_after_start, installed_key, process_started


def test_the_key_changes_when_a_folder_on_sys_path_gains_an_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.setattr(sys, "path", [str(site), str(tmp_path / "missing")])
    before = installed_key()
    assert installed_key() == before  # nothing changed: the same key
    (site / "gpulayer_new-1.0.dist-info").mkdir()
    os.utime(site, ns=(time.time_ns(), time.time_ns() + 10**9))  # whatever the clock's tick
    after = installed_key()
    assert after != before
    assert dict(after)[str(tmp_path / "missing")] == -1


def test_a_distribution_written_after_the_process_started_is_named_so(tmp_path: Path) -> None:
    info = tmp_path / "gpulayer_late-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gpulayer-late\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[gpulayer.providers]\nlate = gpulayer_late:P\n")
    (late,) = PathDistribution(info).entry_points
    assert installed_after_start(late)
    started = process_started()
    assert started <= time.time()
    os.utime(info, (started - 60, started - 60))
    assert not installed_after_start(late)
    assert not installed_after_start(EntryPoint("bare", "m:P", "gpulayer.providers"))
