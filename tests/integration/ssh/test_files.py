"""SFTP uploads and downloads against a real host."""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

import pytest

from gpulayer.ssh.errors import SshTransferError
from gpulayer.ssh.session import SshSession
from tests.support.sshd_hosts import SshdHost


def _remote_dir(host: SshdHost) -> str:
    """A fresh folder name on the host: a test host shares no disk with this machine."""
    return f"/tmp/gpulayer-test-{secrets.token_hex(4)}"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_put_then_get_round_trips_bytes(ssh_host: SshdHost, tmp_path: Path) -> None:
    local = tmp_path / "payload.bin"
    local.write_bytes(os.urandom(300_000))
    remote = str(tmp_path / "remote" / "payload.bin")
    back = tmp_path / "back" / "payload.bin"
    with SshSession(ssh_host.target()) as session:
        session.makedirs(str(tmp_path / "remote"))
        session.put(local, remote)
        remote_sum = session.run(["sha256sum", remote]).stdout.split()[0]
        session.get(remote, back)
    assert remote_sum == _sha256(local)
    assert back.read_bytes() == local.read_bytes()


def test_put_keeps_the_executable_bit_or_sets_the_given_mode(
    ssh_host: SshdHost, tmp_path: Path
) -> None:
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\necho ran-$1\n")
    script.chmod(0o750)
    secret = tmp_path / "token"
    secret.write_text("s3cret")
    remote = _remote_dir(ssh_host)
    with SshSession(ssh_host.target()) as session:
        session.makedirs(remote)
        session.put(script, f"{remote}/up-run.sh")
        session.put(secret, f"{remote}/up-token", mode=0o600)
        result = session.run([f"{remote}/up-run.sh", "ok"])
        modes = session.run(["stat", "-c", "%a", f"{remote}/up-run.sh", f"{remote}/up-token"])
    assert result.stdout == "ran-ok\n"
    assert modes.stdout.split() == ["750", "600"]


def test_put_dir_uploads_a_tree(ssh_host: SshdHost, tmp_path: Path) -> None:
    src = tmp_path / "src"
    files = {
        "a.txt": b"alpha",
        "pkg/__init__.py": b"",
        "pkg/mod.py": b"X = 1\n",
        "pkg/deep/er/data.bin": os.urandom(5000),
    }
    for name, data in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    (src / "empty-dir").mkdir()
    dest = tmp_path / "dest" / "nested"
    with SshSession(ssh_host.target()) as session:
        count = session.put_dir(src, str(dest))
        listing = session.run(f"cd {dest} && find . -type f | sort && find . -type d -empty")
        sums = session.run(f"cd {dest} && sha256sum {' '.join(sorted(files))}")
    assert count == len(files)
    assert listing.stdout.split() == [*sorted(f"./{n}" for n in files), "./empty-dir"]
    expected = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    got = {line.split()[1]: line.split()[0] for line in sums.stdout.splitlines()}
    assert got == expected


def test_get_of_a_missing_file_is_typed_and_leaves_nothing(
    ssh_host: SshdHost, tmp_path: Path
) -> None:
    target = tmp_path / "out" / "missing.txt"
    with SshSession(ssh_host.target()) as session, pytest.raises(SshTransferError) as caught:
        session.get(str(tmp_path / "does-not-exist"), target)
    assert "does-not-exist" in str(caught.value)
    assert list(target.parent.iterdir()) == []


def test_put_into_a_missing_directory_is_typed(ssh_host: SshdHost, tmp_path: Path) -> None:
    local = tmp_path / "f"
    local.write_text("x")
    with SshSession(ssh_host.target()) as session, pytest.raises(SshTransferError) as caught:
        session.put(local, str(tmp_path / "no" / "such" / "dir" / "f"))
    assert str(local) in str(caught.value)


def test_put_of_a_missing_local_file_is_typed(ssh_host: SshdHost, tmp_path: Path) -> None:
    with SshSession(ssh_host.target()) as session, pytest.raises(SshTransferError):
        session.put(tmp_path / "absent", str(tmp_path / "x"))


def test_makedirs_refuses_a_file_in_the_way(ssh_host: SshdHost) -> None:
    remote = _remote_dir(ssh_host)
    ssh_host.run(f"mkdir -p {remote} && echo file > {remote}/blocker", check=True)
    with SshSession(ssh_host.target()) as session, pytest.raises(SshTransferError):
        session.makedirs(f"{remote}/blocker/sub")
    assert ssh_host.run(["test", "-f", f"{remote}/blocker"]).returncode == 0
