"""Which files of an output folder are uploaded: regular ones under the cap, nothing else."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from gpulayer.worker.outputs import gather_outputs


def test_links_fifos_sockets_and_big_files_are_skipped_with_a_reason(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "model.bin").write_bytes(b"x" * 10)
    (out / "sub" / "metrics.json").write_text("{}")
    (out / "big.bin").write_bytes(b"y" * 101)
    (out / "passwd").symlink_to("/etc/passwd")
    (out / "linked-dir").symlink_to(tmp_path)
    os.mkfifo(out / "pipe")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(out / "sock"))
        found = gather_outputs(out, max_file_bytes=100)
    assert [relative for relative, _ in found.files] == ["model.bin", "sub/metrics.json"]
    assert sorted(found.skipped) == [
        "big.bin: 101 bytes, over the 100 byte cap",
        "linked-dir: a symbolic link",
        "passwd: a symbolic link",
        "pipe: a fifo",
        "sock: a socket",
    ]


def test_a_missing_or_linked_output_folder_has_no_outputs(tmp_path: Path) -> None:
    assert gather_outputs(tmp_path / "none").files == []
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert gather_outputs(tmp_path / "link").files == []
