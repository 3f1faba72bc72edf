"""Files a job writes outside its output folder: kept by outputs.paths without following a
link out of the job's folders, and named when a rented machine will delete them."""

from __future__ import annotations

import os
from pathlib import Path

from gpulayer.worker.outside_files import (
    deletion_note,
    human_size,
    keep_matching,
    left_behind,
    snapshot,
)


def _tree(root: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def test_matching_files_are_copied_at_their_paths(tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    _tree(work, {"snapshot.pt": b"s", "ckpt/a.pt": b"a", "ckpt/deep/b.pt": b"b", "log.txt": b"l"})
    out.mkdir()
    kept = keep_matching(work, ["snapshot.pt", "ckpt/**/*.pt"], out)
    assert sorted(kept.copied) == ["ckpt/a.pt", "ckpt/deep/b.pt", "snapshot.pt"]
    assert (out / "ckpt" / "deep" / "b.pt").read_bytes() == b"b"
    assert not (out / "log.txt").exists()


def test_a_link_is_never_followed_in_or_out(tmp_path: Path) -> None:
    work, out, secret = tmp_path / "work", tmp_path / "out", tmp_path / "worker-credential"
    secret.write_text("token")
    work.mkdir()
    out.mkdir()
    (work / "stolen.pt").symlink_to(secret)
    (work / "sub").symlink_to(tmp_path, target_is_directory=True)
    # A link planted in the output folder must not carry the copy elsewhere either.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "ckpt").symlink_to(elsewhere, target_is_directory=True)
    _tree(work, {"ckpt/x.pt": b"x"})
    kept = keep_matching(work, ["*.pt", "sub/**", "ckpt/*.pt"], out)
    assert kept.copied == []
    reasons = dict(line.split(": ", 1) for line in kept.skipped)
    assert reasons["stolen.pt"] == "a symbolic link, not followed"
    assert reasons["ckpt/x.pt"].startswith("cannot be copied")
    assert not (out / "stolen.pt").exists()
    assert list(elsewhere.iterdir()) == []


def test_a_file_of_another_owner_is_not_kept(tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    _tree(work, {"a.pt": b"a"})
    out.mkdir()
    kept = keep_matching(work, ["a.pt"], out, owner_uid=os.getuid() + 1)
    assert kept.skipped == ["a.pt: not the job's own file"]


def test_the_jobs_own_output_wins(tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    _tree(work, {"a.pt": b"from work"})
    _tree(out, {"a.pt": b"from output"})
    kept = keep_matching(work, ["a.pt"], out)
    assert kept.copied == [] and kept.skipped[0].startswith("a.pt: the job wrote that path")
    assert (out / "a.pt").read_bytes() == b"from output"


def test_what_the_job_left_is_named_largest_first(tmp_path: Path) -> None:
    work = tmp_path / "work"
    _tree(work, {"train.py": b"print()", "data.csv": b"1,2"})
    before = snapshot(work)
    _tree(work, {"snapshot.pt": b"x" * 2048, "big.bin": b"y" * 3 * 1024 * 1024, "kept.pt": b"k"})
    _tree(work, {"__pycache__/train.cpython-311.pyc": b"c"})
    left = left_behind(work, before, ["kept.pt"])
    assert left == [("big.bin", 3 * 1024 * 1024), ("snapshot.pt", 2048)]
    assert deletion_note(left[1:]) == (
        "note: 1 file written outside $GPULAYER_OUTPUT_DIR is deleted with the machine: "
        "snapshot.pt (2.0 KB); see outputs.paths"
    )
    many = [(f"f{i}", 10) for i in range(7)]
    assert deletion_note(many).endswith("f4 (10 B) and 2 more; see outputs.paths")
    assert "7 files written" in deletion_note(many) and " are deleted " in deletion_note(many)
    assert human_size(5 * 1024**4) == "5.0 TB"
