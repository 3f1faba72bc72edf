"""Client key pairs made per instance, checked by logging in with them."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest

from gpulayer.ssh.errors import SshKeyError
from gpulayer.ssh.keys import generate_keypair, load_keypair, load_private_key, remove_keypair
from gpulayer.ssh.session import SshSession
from tests.support.sshd_hosts import SshdHost


def test_generated_pair_is_private_and_in_openssh_format(tmp_path: Path) -> None:
    pair = generate_keypair(tmp_path / "keys", "i-0abc", comment="gpulayer-i-0abc")
    assert stat.S_IMODE(pair.private_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(pair.private_path.parent.stat().st_mode) == 0o700
    assert pair.public_key.startswith("ssh-ed25519 ")
    assert pair.public_key.endswith(" gpulayer-i-0abc")
    assert pair.public_path.read_text().strip() == pair.public_key
    # OpenSSH itself derives the same public key from the private file.
    derived = subprocess.run(
        ["ssh-keygen", "-y", "-f", str(pair.private_path)], capture_output=True, text=True
    ).stdout.split()[:2]
    assert derived == pair.public_key.split()[:2]
    assert load_keypair(tmp_path / "keys", "i-0abc") == pair


def test_each_pair_is_new_and_never_overwritten(tmp_path: Path) -> None:
    one = generate_keypair(tmp_path, "a")
    two = generate_keypair(tmp_path, "b")
    assert one.public_key.split()[1] != two.public_key.split()[1]
    before = one.private_path.read_bytes()
    with pytest.raises(SshKeyError, match="already exists"):
        generate_keypair(tmp_path, "a")
    assert one.private_path.read_bytes() == before


def test_remove_is_idempotent(tmp_path: Path) -> None:
    pair = generate_keypair(tmp_path, "gone")
    remove_keypair(pair)
    remove_keypair(pair)
    assert not pair.private_path.exists()
    assert not pair.public_path.exists()
    with pytest.raises(SshKeyError):
        load_keypair(tmp_path, "gone")


@pytest.mark.parametrize("name", ["", "../escape", "a/b", ".hidden", "x" * 200])
def test_bad_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(SshKeyError, match="key name"):
        generate_keypair(tmp_path, name)


def test_missing_or_garbage_private_key_is_typed(tmp_path: Path) -> None:
    with pytest.raises(SshKeyError, match="does not exist"):
        load_private_key(tmp_path / "nope")
    (tmp_path / "garbage").write_text("not a key\n")
    with pytest.raises(SshKeyError):
        load_private_key(tmp_path / "garbage")


def test_generated_key_logs_in_once_authorized(ssh_host: SshdHost, tmp_path: Path) -> None:
    pair = generate_keypair(tmp_path, "instance")
    ssh_host.authorize(pair.public_key)
    with SshSession(ssh_host.target(key_path=pair.private_path)) as session:
        assert session.run("echo in").stdout == "in\n"
