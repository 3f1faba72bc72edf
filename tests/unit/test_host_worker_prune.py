"""A host keeps the worker installs used last, and never removes one a job's dir links to:
the host side's pruning and its seal check, on real folders."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from gpulayer.cloud.bootstrap import host_worker


def _install(root: Path, name: str, used_at: int) -> Path:
    directory = root / name
    (directory / "venv" / "bin").mkdir(parents=True)
    (directory / "venv" / "bin" / "python").write_text("")
    os.utime(directory, (used_at, used_at))
    return directory


def test_only_the_installs_used_last_stay_and_none_in_use_goes(tmp_path: Path) -> None:
    root = tmp_path / "worker"
    old = [_install(root, f"gpulayer-0.0.{i}-{i:024d}", 1_000_000 + i) for i in range(4)]
    # A job's dir beside the root still runs a worker from the oldest install.
    (tmp_path / "job-1").mkdir()
    (tmp_path / "job-1" / "venv").symlink_to(old[0] / "venv")
    keep = _install(root, "gpulayer-0.1.0-" + "f" * 24, 2_000_000)
    host_worker._prune(str(root), str(keep))
    left = sorted(p.name for p in root.iterdir())
    assert left == sorted([keep.name, old[3].name, old[0].name])


def test_a_read_only_install_is_removed_whole(tmp_path: Path) -> None:
    install = _install(tmp_path, "gpulayer-0.0.1-" + "0" * 24, 1_000_000)
    host_worker._read_only(str(install))
    assert stat.S_IMODE((install / "venv").stat().st_mode) == 0o555
    assert stat.S_IMODE((install / "venv" / "bin" / "python").stat().st_mode) == 0o444
    host_worker._writable_then_remove(str(install))
    assert not install.exists()


def test_the_seal_finds_a_changed_an_added_and_a_missing_file(tmp_path: Path) -> None:
    install = _install(tmp_path, "gpulayer-0.0.1-" + "0" * 24, 1_000_000)
    (install / "venv" / "lib").mkdir()
    (install / "venv" / "lib" / "mod.py").write_text("A = 1\n")
    sealed = host_worker.manifest(str(install))
    assert host_worker._difference(sealed, host_worker.manifest(str(install))) is None
    (install / "venv" / "lib" / "mod.py").write_text("A = 2\n")
    assert host_worker._difference(sealed, host_worker.manifest(str(install))) == (
        "venv/lib/mod.py changed"
    )
    (install / "venv" / "lib" / "mod.py").write_text("A = 1\n")
    (install / "venv" / "lib" / "extra.pth").write_text("import os\n")
    assert host_worker._difference(sealed, host_worker.manifest(str(install))) == (
        "venv/lib/extra.pth was added"
    )
    (install / "venv" / "lib" / "extra.pth").unlink()
    (install / "venv" / "bin" / "python").unlink()
    assert host_worker._difference(sealed, host_worker.manifest(str(install))) == (
        "venv/bin/python is missing"
    )


def test_a_file_with_its_sealed_stamp_is_not_read_again_and_a_written_one_is(
    tmp_path: Path,
) -> None:
    install = _install(tmp_path, "gpulayer-0.0.1-" + "0" * 24, 1_000_000)
    module = install / "venv" / "bin" / "python"
    stamp = host_worker.stamps(str(install))["venv/bin/python"]
    entry = ["file", 0, "digest-as-sealed", False]
    trusted = {"venv/bin/python": (stamp, entry)}
    assert host_worker.manifest(str(install), trusted)["venv/bin/python"] == entry
    # The same bytes written again: the kernel moves the change time (at its clock's
    # granularity, so written until it shows).
    deadline = time.monotonic() + 5
    while host_worker.stamps(str(install))["venv/bin/python"] == stamp:
        assert time.monotonic() < deadline, "the change time never moved"
        module.write_text("")
    again = host_worker.manifest(str(install), trusted)["venv/bin/python"]
    assert again[2] != "digest-as-sealed" and again[1] == 0
