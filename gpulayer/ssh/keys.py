"""Client key pairs: one ed25519 pair per instance, so a leaked key opens one machine only."""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpulayer.ssh.errors import SshKeyError

if TYPE_CHECKING:
    import paramiko

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class KeyPair:
    private_path: Path
    public_path: Path
    public_key: str
    """OpenSSH public key line: ``ssh-ed25519 AAAA... comment``."""


def _paths(directory: Path, name: str) -> tuple[Path, Path]:
    if not _NAME.match(name):
        raise SshKeyError(
            f"key name {name!r} must be letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    private = Path(directory) / name
    return private, private.with_name(name + ".pub")


def _write_new(path: Path, data: bytes, mode: int) -> None:
    # O_EXCL with the final mode: the private key is never readable by others, not even briefly.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def generate_keypair(directory: Path, name: str, *, comment: str = "gpulayer") -> KeyPair:
    """Create ``directory/name`` (0600, OpenSSH private key) and ``directory/name.pub``.

    Refuses to replace an existing key: an instance's key is made once and removed with it.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if any(c.isspace() for c in comment):
        raise SshKeyError(f"key comment {comment!r} must not contain whitespace")
    private_path, public_path = _paths(directory, name)
    Path(directory).mkdir(mode=0o700, parents=True, exist_ok=True)
    if private_path.exists() or public_path.exists():
        raise SshKeyError(f"key {private_path} already exists")
    key = Ed25519PrivateKey.generate()
    private_bytes = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public_line = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode("ascii")
    )
    public_line = f"{public_line} {comment}" if comment else public_line
    try:
        _write_new(private_path, private_bytes, 0o600)
        _write_new(public_path, (public_line + "\n").encode("ascii"), 0o644)
    except OSError as exc:
        with contextlib.suppress(OSError):
            private_path.unlink()
        raise SshKeyError(f"cannot write key {private_path}: {exc.strerror or exc}") from exc
    return KeyPair(private_path, public_path, public_line)


def load_keypair(directory: Path, name: str) -> KeyPair:
    """The pair written by :func:`generate_keypair`."""
    private_path, public_path = _paths(directory, name)
    try:
        public_line = public_path.read_text(encoding="ascii").strip()
    except OSError as exc:
        raise SshKeyError(f"cannot read public key {public_path}: {exc.strerror or exc}") from exc
    if not private_path.is_file():
        raise SshKeyError(f"private key {private_path} is missing")
    return KeyPair(private_path, public_path, public_line)


def remove_keypair(pair: KeyPair) -> None:
    """Delete both files; already gone is fine, since teardown may run twice."""
    for path in (pair.private_path, pair.public_path):
        path.unlink(missing_ok=True)


def load_private_key(path: Path) -> paramiko.PKey:
    """A paramiko key object for ``path``, whatever its type."""
    import paramiko

    try:
        return paramiko.PKey.from_path(Path(path))
    except FileNotFoundError as exc:
        raise SshKeyError(f"client key {path} does not exist") from exc
    except (OSError, paramiko.SSHException, ValueError) as exc:
        raise SshKeyError(f"cannot load client key {path}: {exc}") from exc
