"""The team server's secret store: values encrypted at rest (Fernet: AES-128-CBC with an
HMAC-SHA256), with a key held in a file of its own beside the database, readable by the server's
user alone, never in the database. A value is decrypted only to hand it to the worker that claims
an attempt of a job naming it; no route returns one.

Two servers over one PostgreSQL database need the same key file.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpulayer.control.store import Store
from gpulayer.errors import GpulayerError, NotFoundError, UsageError

SERVER_SCOPE = "server"
"""The server's own secrets: every job of the server may name them."""
MAX_VALUE_BYTES = 64 * 1024
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class SecretKeyError(GpulayerError):
    """The key file cannot be read, or others may read it: the server refuses to start."""


class SecretVault:
    def __init__(self, store: Store, key_path: Path) -> None:
        self.store = store
        self.key_path = key_path
        if key_path.exists():
            self._read_key()  # a key file others may read stops the server here, not a claim

    def put(self, name: str, value: str) -> bool:
        """Keep ``value`` under ``name``, encrypted; True when the secret is new."""
        check_name(name)
        data = value.encode()
        if not data:
            raise UsageError("value: empty; a secret needs a value")
        if len(data) > MAX_VALUE_BYTES:
            raise UsageError(f"value: longer than {MAX_VALUE_BYTES} bytes")
        return self.store.put_secret(SERVER_SCOPE, name, self._cipher(create=True).encrypt(data))

    def listing(self) -> list[dict[str, Any]]:
        """Each secret's name and times, never its value."""
        return [
            {"name": name, "created_at": created, "updated_at": updated}
            for name, created, updated in self.store.secret_names(SERVER_SCOPE)
        ]

    def remove(self, name: str) -> None:
        check_name(name)
        if not self.store.remove_secret(SERVER_SCOPE, name):
            raise NotFoundError(f"no secret named {name!r}")

    def values(self, names: Iterable[str]) -> dict[str, str]:
        """The values the store holds of ``names`` (those it does not hold are left out)."""
        wanted = sorted(set(names))
        if not wanted or not self.key_path.exists():
            return {}
        found = self.store.secret_ciphertexts(SERVER_SCOPE, wanted)
        if not found:
            return {}
        cipher = self._cipher(create=False)
        return {name: cipher.decrypt(data).decode() for name, data in found.items()}

    def _cipher(self, *, create: bool) -> Any:
        from cryptography.fernet import Fernet

        if create and not self.key_path.exists():
            key = Fernet.generate_key()
            self.key_path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(self.key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                pass  # another server made it first: read theirs
            else:
                with os.fdopen(fd, "wb") as out:
                    out.write(key)
        return Fernet(self._read_key())

    def _read_key(self) -> bytes:
        try:
            fd = os.open(self.key_path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            raise SecretKeyError(f"secrets key file {self.key_path}: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as source:
            mode = stat.S_IMODE(os.fstat(source.fileno()).st_mode)
            if mode & 0o077:
                raise SecretKeyError(
                    f"secrets key file {self.key_path} is open to others (mode {mode:o}); "
                    f"run chmod 600 {self.key_path}"
                )
            return source.read().strip()


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise UsageError(
            f"name: {name!r} is not a secret name (letters, digits and _, not starting with a "
            "digit, as an environment variable's)"
        )
    return name
