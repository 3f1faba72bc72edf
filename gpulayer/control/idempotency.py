"""Exactly once at submit: the ``Idempotency-Key`` header of create requests.

A client sends a fresh key with every create (a job, a list of jobs, an array, a token) and
sends the same key again only when it resends that very request, after its answer was lost.
The server keeps, for a day, each caller's key with the sha256 of the request and the ids it
made (store/once_keys.py, written in the creating transaction), and answers a resent request
with those records instead of making new ones. The same key with another request is the
caller's mistake, refused naming the header.
"""

from __future__ import annotations

import hashlib
import threading
import time
from typing import TYPE_CHECKING

from gpulayer.control.store.once_keys import KeptAnswer, OnceKey
from gpulayer.errors import GpulayerError, SpecError, UsageError

if TYPE_CHECKING:
    from gpulayer.control.auth import Principal
    from gpulayer.control.store import Store

HEADER = "Idempotency-Key"
WINDOW_SECONDS = 24 * 3600.0
"""How long a key is remembered: a request resent later than this makes new records."""
MAX_KEY_LENGTH = 255
_SWEEP_EVERY = 600.0


class TokenShownOnce(GpulayerError):
    """A resent token create: its token exists, but its value is not kept to show again."""

    exit_code = 2


def caller_of(principal: Principal) -> str:
    """Whose key it is: keys of different tokens never meet (the local control plane's one
    token has no id)."""
    return f"{principal.kind}:{principal.token_id or 'local'}"


def parse_key(raw: str | None) -> str | None:
    if raw is None:
        return None
    if not 1 <= len(raw) <= MAX_KEY_LENGTH or not all(" " < c <= "~" for c in raw):
        raise UsageError(
            f"{HEADER}: 1 to {MAX_KEY_LENGTH} printable ASCII characters without spaces"
        )
    return raw


def request_key(
    principal: Principal, raw: str | None, method: str, path: str, body: bytes
) -> OnceKey | None:
    """The request's key, or None when it sent none (then it creates every time)."""
    key = parse_key(raw)
    if key is None:
        return None
    digest = hashlib.sha256(f"{method} {path}\n".encode())
    digest.update(body)
    return OnceKey(caller_of(principal), key, digest.hexdigest())


class Answers:
    """Looks up kept answers and drops the expired ones now and then (lazily, at most every
    ten minutes, from the requests that use keys)."""

    def __init__(self, store: Store, *, window: float = WINDOW_SECONDS) -> None:
        self.store = store
        self.window = window
        self._swept = 0.0
        self._lock = threading.Lock()

    def prior(self, once: OnceKey | None) -> list[str] | None:
        """The ids a request with this key made before, or None when it is new. Raises
        SpecError (422) when the key was used for a different request."""
        kept = self.kept(once)
        return None if kept is None else kept.ids

    def kept(self, once: OnceKey | None) -> KeptAnswer | None:
        """prior()'s whole answer, with what else it said."""
        if once is None:
            return None
        now = time.time()
        self._sweep(now)
        kept = self.store.kept_answer(once.caller, once.key, since=now - self.window)
        if kept is not None:
            _same_request(once, kept)
        return kept

    def _sweep(self, now: float) -> None:
        with self._lock:
            if now - self._swept < _SWEEP_EVERY:
                return
            self._swept = now
        self.store.forget_answers_before(now - self.window)


def _same_request(once: OnceKey, kept: KeptAnswer) -> list[str]:
    if kept.fingerprint != once.fingerprint:
        raise SpecError(
            [
                f"{HEADER}: {once.key!r} was already used for a different request; "
                "send a new key with each new request"
            ]
        )
    return kept.ids
