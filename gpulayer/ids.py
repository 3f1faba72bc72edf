"""Short, readable, collision-resistant ids (job j-xxxxxxxx, worker w-xxxxxxxx)."""

from __future__ import annotations

import secrets

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower-case: no i/l/o/u
# Each random byte's low five bits pick a letter: 256 is a multiple of 32, so every letter is
# as likely as any other. A list submit names thousands of jobs at once, so one call to the
# random source and one table lookup per id, rather than a draw per letter.
_LETTER_OF_BYTE = bytes(ord(_ALPHABET[byte % len(_ALPHABET)]) for byte in range(256))


def new_id(prefix: str, length: int = 10) -> str:
    return prefix + "-" + secrets.token_bytes(length).translate(_LETTER_OF_BYTE).decode("ascii")
