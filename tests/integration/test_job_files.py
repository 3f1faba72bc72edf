"""The worker reads what a job wrote without following links, without blocking on special
files, and within bounds: a function job's result file, its outputs (checkpoints among them).

Jobs here run as an unprivileged user where the tests run as root, so a root-only file is
something the job itself cannot read: only a worker that followed its link could."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer.protocol.job_files import JobFileError, open_job_file, read_job_file
from gpulayer.spec import JobSpec
from gpulayer.worker.process import RunAs
from gpulayer.worker.runner import JobRun, RunContext, RunOutcome

SECRET = "root-only-secret-7f3a"

MODULE = """
import os

def _result():
    return os.environ["GPULAYER_FUNCTION_RESULT"]

def link_to(target):
    os.symlink(target, _result())
    os._exit(0)

def fifo():
    os.mkfifo(_result())
    os._exit(0)

def swap_folder(decoy):
    folder = os.path.dirname(_result())
    os.rename(folder, folder + ".moved")
    os.symlink(decoy, folder)
    os._exit(0)

def swap_reports_folder(decoy):
    folder = os.path.dirname(os.environ["GPULAYER_TRAIN_REPORTS"])
    os.rename(folder, folder + ".moved")
    os.symlink(decoy, folder)
    os._exit(1)

def huge(size):
    with open(_result(), "w") as f:
        f.write('{"ok": true, "value": "' + "x" * size + '"}')
    os._exit(0)

def fine():
    return {"answer": 42}
"""


@pytest.fixture
def place() -> Iterator[Path]:
    """A folder the job's user can reach (pytest's own tree is closed to others)."""
    base = Path(tempfile.mkdtemp(prefix="gpulayer-jobfiles-"))
    base.chmod(0o755)
    source = base / "src"
    source.mkdir()
    (source / "jobs.py").write_text(textwrap.dedent(MODULE))
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def root_only(place: Path) -> Path:
    """A root-only 0600 file whose content would pass for a result."""
    closed = place / "closed"
    closed.mkdir(mode=0o700)
    secret = closed / "secret.json"
    secret.write_text(json.dumps({"ok": True, "value": SECRET}))
    secret.chmod(0o600)
    return secret


def run_function(place: Path, entrypoint: str, *args: object) -> tuple[RunOutcome, str]:
    spec = JobSpec.model_validate(
        {"workload": {"kind": "function", "entrypoint": entrypoint, "args": list(args)}}
    )
    run_as = RunAs.lookup("nobody") if os.geteuid() == 0 else None
    lines: list[str] = []
    context = RunContext(
        "job-1",
        1,
        spec,
        place / "attempt",
        source_dir=place / "src",
        python="/usr/bin/python3" if run_as is not None else RunContext.python,
        run_as=run_as,
    )
    found: dict[str, RunOutcome] = {}
    thread = threading.Thread(
        target=lambda: found.update(outcome=JobRun(context, lambda s, t: lines.append(t)).run()),
        daemon=True,
    )
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "reading the job's result blocked the worker"
    return found["outcome"], "".join(lines)


def test_a_result_that_links_to_a_root_only_file_is_refused(place: Path, root_only: Path) -> None:
    outcome, logs = run_function(place, "jobs:link_to", str(root_only))
    assert outcome.state == "failed" and outcome.reason == "function_error", outcome
    assert outcome.message is not None and "symbolic link" in outcome.message
    assert SECRET not in json.dumps([outcome.result, outcome.message]) and SECRET not in logs


def test_a_result_that_is_a_fifo_does_not_block_the_worker(place: Path) -> None:
    outcome, _ = run_function(place, "jobs:fifo")
    assert outcome.state == "failed", outcome
    assert outcome.message is not None and "not a regular file (a fifo)" in outcome.message


def test_a_result_that_links_to_dev_zero_is_refused_without_reading_it(place: Path) -> None:
    outcome, _ = run_function(place, "jobs:link_to", "/dev/zero")
    assert outcome.state == "failed", outcome
    assert outcome.message is not None and "symbolic link" in outcome.message


def test_a_result_folder_swapped_for_a_link_is_refused(place: Path, root_only: Path) -> None:
    outcome, _ = run_function(place, "jobs:swap_folder", str(root_only.parent))
    assert outcome.state == "failed", outcome
    assert outcome.message is not None and "symbolic link" in outcome.message
    assert SECRET not in json.dumps([outcome.result, outcome.message])


def test_a_reports_folder_swapped_for_a_link_is_not_read(place: Path, root_only: Path) -> None:
    from gpulayer.worker.train_reports import REPORTS_FILE

    reports = root_only.parent / REPORTS_FILE  # what a failed run's reports would pass for
    reports.write_text(json.dumps({"epoch": 0, "loss": SECRET}) + "\n")
    reports.chmod(0o600)
    outcome, logs = run_function(place, "jobs:swap_reports_folder", str(root_only.parent))
    assert outcome.state == "failed", outcome
    assert (place / "attempt" / ".gpulayer").is_symlink()  # the job did swap it
    assert outcome.result is None, outcome
    assert SECRET not in json.dumps([outcome.result, outcome.message]) and SECRET not in logs


def test_a_result_over_the_cap_says_so(place: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpulayer.worker import function_result

    monkeypatch.setattr(function_result, "RESULT_LIMIT_BYTES", 4096)
    outcome, _ = run_function(place, "jobs:huge", 10_000)
    assert outcome.state == "failed", outcome
    assert outcome.message is not None and "more than the 4096 byte limit" in outcome.message


def test_a_plain_result_still_comes_back(place: Path) -> None:
    outcome, _ = run_function(place, "jobs:fine")
    assert (outcome.state, outcome.result) == ("succeeded", {"answer": 42})


# --- the opener itself, on real files -------------------------------------------------------


def test_open_job_file_refuses_links_special_files_and_escapes(tmp_path: Path) -> None:
    root = tmp_path / "out"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "ok.txt").write_text("ok")
    (root / "link").symlink_to("/etc/passwd")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x").write_text("not yours")
    (root / "dir-link").symlink_to(tmp_path / "elsewhere")
    os.mkfifo(root / "pipe")
    with open_job_file(root, "sub/ok.txt") as (stream, info):
        assert (stream.read(), info.st_size) == (b"ok", 2)
    cases = {
        "link": "a symbolic link",
        "dir-link/x": "a symbolic link",
        "pipe": "not a regular file (a fifo)",
        "../out/sub/ok.txt": "leaves its folder",
        "missing": "does not exist",
    }
    for relative, why in cases.items():
        with pytest.raises(JobFileError, match=re.escape(why)), open_job_file(root, relative):
            pass
    (tmp_path / "zero").symlink_to("/dev/zero")
    with pytest.raises(JobFileError, match="symbolic link"):
        read_job_file(tmp_path, "zero", limit=10)
    (root / "big").write_bytes(b"x" * 100)
    with pytest.raises(JobFileError, match="100 bytes, more than the 10 byte limit"):
        read_job_file(root, "big", limit=10)
