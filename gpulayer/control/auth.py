"""Who is calling: bearer tokens mapped to a principal, checked against the store on every call.

Three kinds of principal:

* ``admin``: submits, cancels, reads everything, makes tokens.
* ``join``: may only register new workers (``gpulayer token create --worker``), up to its
  ``max_workers`` and until it expires.
* ``worker``: one registered worker's own credential, handed out by registration; it reaches
  only that worker's heartbeat, claims and attempts.

Nothing is cached that could outlive a revocation: every call reads the token's row. Only the
result of an scrypt comparison is remembered (by the token's SHA-256, in memory), since that
comparison is deliberately slow.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from gpulayer.control.store import Store, TokenRecord
from gpulayer.control.tokens import (
    hash_token,
    is_generated,
    new_salt,
    new_token,
    new_token_id,
    scrypt_digest,
    scrypt_matches,
)

PrincipalKind = Literal["admin", "join", "worker"]
TOKEN_KINDS: tuple[PrincipalKind, ...] = ("admin", "join", "worker")
_REMEMBERED_FAILURES = 1024


@dataclass(frozen=True)
class Principal:
    kind: PrincipalKind
    token_id: str | None
    worker_id: str | None = None


LOCAL_ADMIN = Principal("admin", None)


def issue_token(
    store: Store,
    kind: PrincipalKind,
    name: str = "",
    *,
    expires_at: float | None = None,
    max_workers: int | None = None,
    worker_id: str | None = None,
    parent_id: str | None = None,
) -> tuple[str, TokenRecord]:
    """A new random token of this kind; returns it (shown once) and its record."""
    token = new_token()
    record = store.add_token(
        hash_token(token),
        kind,
        name,
        expires_at=expires_at,
        max_workers=max_workers,
        worker_id=worker_id,
        parent_id=parent_id,
    )
    return token, record


def keep_chosen_token(store: Store, token: str, kind: PrincipalKind, name: str) -> TokenRecord:
    """A token a person chose: stored as a salted scrypt digest, never a fast hash."""
    token_id = new_token_id()
    salt = new_salt()
    return store.add_token(
        f"scrypt:{token_id}",
        kind,
        name,
        id=token_id,
        scheme="scrypt",
        salt=salt.hex(),
        digest=scrypt_digest(token, salt),
    )


class TokenAuthority:
    """Maps a bearer token to its principal, or None when unknown, revoked or expired."""

    def __init__(self, store: Store, *, local_admin_token: str | None = None) -> None:
        self.store = store
        self._local_admin = local_admin_token.encode() if local_admin_token else None
        self._lock = threading.Lock()
        self._scrypt_verified: dict[str, str] = {}  # sha256 of token -> token id
        self._failures: OrderedDict[str, frozenset[str]] = OrderedDict()

    def __call__(self, token: str) -> Principal | None:
        return self.authenticate(token)

    def authenticate(self, token: str) -> Principal | None:
        if self._local_admin is not None and hmac.compare_digest(token.encode(), self._local_admin):
            return LOCAL_ADMIN
        fast = hash_token(token)
        record = self.store.token_by_hash(fast)
        if record is None:
            record = self._scrypt_match(token, fast)
        elif record.scheme == "sha256" and record.kind == "admin" and not is_generated(token):
            self._upgrade_to_scrypt(token, record)
        if record is None or record.refused_because(time.time()) is not None:
            return None
        kind = record.kind if record.kind in TOKEN_KINDS else None
        if kind is None:
            return None
        return Principal(kind, record.id, record.worker_id)

    def _scrypt_match(self, token: str, fast: str) -> TokenRecord | None:
        with self._lock:
            known = self._scrypt_verified.get(fast)
        if known is not None:
            try:
                return self.store.get_token(known)
            except Exception:
                return None
        candidates = self.store.scrypt_tokens()
        ids = frozenset(c.id for c in candidates)
        with self._lock:
            if self._failures.get(fast) == ids:
                return None  # the same wrong token again, and no new chosen token since
        for candidate in candidates:
            if (
                candidate.salt
                and candidate.digest
                and scrypt_matches(token, candidate.salt, candidate.digest)
            ):
                with self._lock:
                    self._scrypt_verified[fast] = candidate.id
                return candidate
        with self._lock:
            self._failures[fast] = ids
            while len(self._failures) > _REMEMBERED_FAILURES:
                self._failures.popitem(last=False)
        return None

    def _upgrade_to_scrypt(self, token: str, record: TokenRecord) -> None:
        """An admin token chosen before schema 4 was kept as a bare SHA-256: rehash it."""
        salt = new_salt()
        self.store.upgrade_token_hash(
            record.id,
            hash=f"scrypt:{record.id}",
            scheme="scrypt",
            salt=salt.hex(),
            digest=scrypt_digest(token, salt),
        )
        with self._lock:
            self._scrypt_verified[hash_token(token)] = record.id
