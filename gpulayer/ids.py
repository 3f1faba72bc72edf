"""Short, readable, collision-resistant ids (job j-xxxxxxxx, worker w-xxxxxxxx)."""

from __future__ import annotations

import secrets

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower-case: no i/l/o/u


def new_id(prefix: str, length: int = 10) -> str:
    return prefix + "-" + "".join(secrets.choice(_ALPHABET) for _ in range(length))
