"""Bundling a directory other processes are writing to: a file appended to is taken as read (a
prefix of what it became), files removed meanwhile are left out, and neither fails the bundle."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpulayer.protocol.bundle import bundle_warning, create_bundle, extract_bundle

# Paced, as a training log is: a busy loop would only measure how fast 2 cores read gigabytes.
pytestmark = pytest.mark.slow

APPENDER = """
import sys, itertools, time
with open(sys.argv[1], "a", buffering=1) as out:
    for n in itertools.count():
        out.write(f"{n:09d}\\n")
        time.sleep(0.0002)
"""

CHURNER = """
import os, sys, itertools, time
folder = sys.argv[1]
for n in itertools.count():
    path = os.path.join(folder, f"tmp-{n % 50:02d}.part")
    with open(path, "w") as out:
        out.write("x" * 100)
    if n % 2:
        os.remove(path)
    time.sleep(0.0002)
"""


@contextmanager
def running(script: str, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", script, *args])
    try:
        yield process
    finally:
        process.kill()
        process.wait(timeout=10)


def wait_for_size(path: Path, size: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size >= size:
            return
        time.sleep(0.01)
    raise AssertionError(f"{path} never reached {size} bytes")


def busy_tree(root: Path) -> Path:
    for i in range(150):  # enough files that the walk and the reading lie apart in time
        (root / "pkg" / f"m{i:03d}.py").parent.mkdir(parents=True, exist_ok=True)
        (root / "pkg" / f"m{i:03d}.py").write_text(f"X = {i}\n")
    (root / "scratch").mkdir()
    return root


def test_a_file_appended_to_is_taken_as_read(tmp_path: Path) -> None:
    src = busy_tree(tmp_path / "src")
    log = src / "zz-train.log"  # sorts last: read well after the walk saw its size
    named = 0
    with running(APPENDER, str(log)):
        wait_for_size(log, 1_000)
        for attempt in range(8):
            info = create_bundle(src, tmp_path / f"b{attempt}.tar.gz")
            dest = tmp_path / f"out{attempt}"
            extract_bundle(info.path, dest)
            taken = (dest / log.name).read_text()
            lines = taken.splitlines(keepends=True)
            assert lines, "the log was left out"
            # A prefix of the sequence the appender wrote: whole, in order, nothing invented.
            complete = [line for line in lines if line.endswith("\n")]
            assert [int(line) for line in complete] == list(range(len(complete)))
            assert "\x00" not in taken
            if log.name in info.changed:
                named += 1
                warning = bundle_warning(info)
                assert warning is not None and log.name in warning
                assert len(warning.splitlines()) == 1
    assert named >= 1, "a file growing throughout was never reported as changed"


def test_files_that_vanish_while_bundling_are_left_out(tmp_path: Path) -> None:
    src = busy_tree(tmp_path / "src")
    with running(CHURNER, str(src / "scratch")):
        wait_for_size(src / "scratch" / "tmp-00.part", 100)
        for attempt in range(8):
            info = create_bundle(src, tmp_path / f"b{attempt}.tar.gz")
            with tarfile.open(info.path) as tar:
                members = tar.getnames()
            assert "pkg/m149.py" in members
            for gone in info.vanished:
                assert gone.startswith("scratch/"), gone
                assert gone not in members
            for name in info.changed:
                assert name.startswith("scratch/"), name
