"""API tokens: made, kept in 0600 files, and hashed for the store.

Tokens gpulayer generates carry 256 random bits and a recognisable prefix; a fast SHA-256 is
enough to store them and finds their row by index. A token a person chose (an admin token set
through GPULAYER_TOKEN) may be guessable, so it is kept as a salted scrypt digest instead.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

GENERATED_PREFIX = "gl_"
_SCRYPT = {"n": 2**14, "r": 8, "p": 1, "maxmem": 64 * 1024 * 1024, "dklen": 32}


def new_token() -> str:
    return GENERATED_PREFIX + secrets.token_urlsafe(32)


def new_token_id() -> str:
    return "t-" + secrets.token_hex(5)


def is_generated(token: str) -> bool:
    return token.startswith(GENERATED_PREFIX) and len(token) >= len(GENERATED_PREFIX) + 40


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def scrypt_digest(token: str, salt: bytes) -> str:
    return hashlib.scrypt(token.encode(), salt=salt, **_SCRYPT).hex()


def new_salt() -> bytes:
    return os.urandom(16)


def scrypt_matches(token: str, salt_hex: str, digest_hex: str) -> bool:
    return hmac.compare_digest(scrypt_digest(token, bytes.fromhex(salt_hex)), digest_hex)


def ensure_token(path: Path, *, preset: str | None = None) -> str:
    """The token stored at path, creating it (from preset, or random) the first time."""
    try:
        existing = path.read_text().strip()
    except FileNotFoundError:
        existing = ""
    if existing:
        return existing
    token = preset or new_token()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    return token


def read_token(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None
