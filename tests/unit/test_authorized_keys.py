"""The lines a launch adds to an authorized_keys file (ssh hosts, a Slurm cluster's home)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpulayer.cloud import (
    add_authorized_key_command,
    authorized_key_line,
    generate_keypair,
    remove_authorized_key_command,
)


def test_a_key_line_carries_the_request_marker_and_nothing_else(tmp_path: Path) -> None:
    keys = generate_keypair(tmp_path, "r-1")
    kind, blob = keys.public_key.split()[:2]
    assert authorized_key_line(keys.public_key + " me@laptop", "r-1") == (
        f"{kind} {blob} gpulayer-request:r-1"
    )
    with pytest.raises(ValueError):
        authorized_key_line("hello", "r-1")
    with pytest.raises(ValueError, match="without options"):
        authorized_key_line(f'command="sh" {kind} {blob}', "r-1")


def test_add_and_remove_keep_the_users_own_lines(tmp_path: Path) -> None:
    keys = generate_keypair(tmp_path, "r-2")
    file = tmp_path / "home" / ".ssh" / "authorized_keys"
    file.parent.mkdir(parents=True)
    file.write_text("ssh-ed25519 AAAAmine me@laptop")  # no final newline
    env = {"HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    add = add_authorized_key_command("~/.ssh/authorized_keys", keys.public_key, "r-2")
    for _ in range(2):  # a retried launch adds nothing more
        subprocess.run(["sh", "-c", add], check=True, env=env)
    lines = file.read_text().splitlines()
    assert lines[0] == "ssh-ed25519 AAAAmine me@laptop" and len(lines) == 2
    assert lines[1].endswith(" gpulayer-request:r-2")
    remove = remove_authorized_key_command("~/.ssh/authorized_keys", "r-2")
    subprocess.run(["sh", "-c", remove], check=True, env=env)
    assert file.read_text().splitlines() == ["ssh-ed25519 AAAAmine me@laptop"]


def test_edits_at_once_from_many_launches_lose_no_line(tmp_path: Path) -> None:
    """A cluster's shared home takes the keys of jobs launched and torn down at once: every
    edit is read-modify-write, so two at a time must not undo each other (a removed key back
    in the file is a credential left behind; an added one lost is a job that cannot log in)."""
    keys = [generate_keypair(tmp_path / "keys", f"r-{n}") for n in range(8)]
    file = tmp_path / "home" / ".ssh" / "authorized_keys"
    file.parent.mkdir(parents=True)
    env = {"HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    path = "~/.ssh/authorized_keys"
    leaving, arriving = range(4), range(4, 8)
    for _ in range(15):
        file.write_text("ssh-ed25519 AAAAmine me@laptop\n")
        for n in leaving:
            add = add_authorized_key_command(path, keys[n].public_key, f"r-{n}")
            subprocess.run(["sh", "-c", add], check=True, env=env)
        edits = [remove_authorized_key_command(path, f"r-{n}") for n in leaving] + [
            add_authorized_key_command(path, keys[n].public_key, f"r-{n}") for n in arriving
        ]
        shells = [subprocess.Popen(["sh", "-c", edit], env=env) for edit in edits]
        assert [shell.wait(timeout=60) for shell in shells] == [0] * len(edits)
        lines = file.read_text().splitlines()
        assert lines[0] == "ssh-ed25519 AAAAmine me@laptop"
        assert sorted(line.rsplit(":", 1)[1] for line in lines[1:]) == [
            f"r-{n}" for n in arriving
        ], lines
