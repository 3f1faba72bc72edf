"""The private copy of a job's files that a more privileged process reads: made by a real tar
process, only plain files and folders kept."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from gpulayer.worker.job_copy import JobCopyError, Wanted, copy_as_job


def test_files_and_folders_are_copied_with_their_digests(tmp_path: Path) -> None:
    source = tmp_path / "work"
    (source / "wheels" / "sub").mkdir(parents=True)
    (source / "wheels" / "a.whl").write_bytes(b"wheel-a")
    (source / "wheels" / "sub" / "b.whl").write_bytes(b"wheel-b")
    (source / "requirements.txt").write_text("x==1\n")
    (source / "not-named.txt").write_text("left out")
    dest = tmp_path / "copy"
    wanted = [
        Wanted("setup.find_links", "wheels"),
        Wanted("setup.requirements_file", "requirements.txt"),
    ]
    digests = copy_as_job(source, wanted, dest, run_as=None)
    assert digests == {
        "wheels/a.whl": hashlib.sha256(b"wheel-a").hexdigest(),
        "wheels/sub/b.whl": hashlib.sha256(b"wheel-b").hexdigest(),
        "requirements.txt": hashlib.sha256(b"x==1\n").hexdigest(),
    }
    assert (dest / "wheels" / "sub" / "b.whl").read_bytes() == b"wheel-b"
    assert not (dest / "not-named.txt").exists()
    assert dest.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("kind", ["link inside", "link itself", "fifo", "hard link"])
def test_a_link_or_special_file_is_refused_naming_the_field(tmp_path: Path, kind: str) -> None:
    source = tmp_path / "work"
    outside = tmp_path / "secret.whl"
    outside.write_bytes(b"private")
    wheels = source / "wheels"
    if kind == "link itself":
        source.mkdir()
        wheels.symlink_to(tmp_path)
    else:
        wheels.mkdir(parents=True)
        (wheels / "ok.whl").write_bytes(b"ok")
        if kind == "link inside":
            (wheels / "x.whl").symlink_to(outside)
        elif kind == "fifo":
            os.mkfifo(wheels / "x.whl")
        else:
            os.link(wheels / "ok.whl", wheels / "x.whl")
    with pytest.raises(JobCopyError) as caught:
        copy_as_job(source, [Wanted("setup.find_links", "wheels")], tmp_path / "copy", run_as=None)
    message = str(caught.value)
    assert message.startswith("setup.find_links: 'wheels'"), message
    assert "private" not in message


def test_a_missing_path_names_the_field(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    with pytest.raises(JobCopyError, match=r"^setup.requirements_file: 'req.txt': cannot be read"):
        copy_as_job(
            tmp_path / "work", [Wanted("setup.requirements_file", "req.txt")], tmp_path / "c",
            run_as=None,
        )  # fmt: skip
