"""Who is calling: bearer tokens mapped to a principal, checked against the store on every call.

Three kinds of principal:

* ``admin``: submits, cancels, reads everything, makes tokens.
* ``join``: may only register new workers (``gpulayer token create --worker``), up to its
  ``max_workers`` and until it expires.
* ``worker``: one registered worker's own credential, handed out by registration; it reaches
  only that worker's heartbeat, claims and attempts.

A token's row is remembered for at most a second (see TokenAuthority), so a revocation is seen
within a second by every server on the store, and at once by the one that made it.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from gpulayer.control.store import Store, TokenRecord
from gpulayer.control.store.once_keys import OnceKey
from gpulayer.control.tokens import (
    hash_token,
    is_generated,
    new_salt,
    new_token,
    new_token_id,
    scrypt_digest,
    scrypt_matches,
)
from gpulayer.errors import NotFoundError

PrincipalKind = Literal["admin", "join", "worker"]
TOKEN_KINDS: tuple[PrincipalKind, ...] = ("admin", "join", "worker")
_REMEMBERED = 4096


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
    once: OnceKey | None = None,
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
        once=once,
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


class _Unchecked(enum.Enum):
    UNCHECKED = enum.auto()


_UNCHECKED = _Unchecked.UNCHECKED


class TokenAuthority:
    """Maps a bearer token to its principal, or None when unknown, revoked or expired.

    Every token is first judged by keyed hash lookups: its SHA-256 finds a generated token's
    row by index, and an HMAC under a key this process drew finds, in memory, a chosen token
    this process verified before. Known tokens' rows are kept for at most ``fresh_seconds``
    (and dropped at once when this process revokes or removes a token), so a revocation is
    seen within that time by every server sharing the store. The slow scrypt comparison runs
    only while some chosen token is still unverified here, one at a time, and at most
    ``slow_checks_per_minute`` times per client: a flood of wrong tokens costs lookups, never
    scrypt, and cannot slow anyone else's calls.
    """

    def __init__(
        self,
        store: Store,
        *,
        local_admin_token: str | None = None,
        fresh_seconds: float = 1.0,
        slow_checks_per_minute: int = 6,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self._local_admin = local_admin_token.encode() if local_admin_token else None
        self._fresh = fresh_seconds
        self._slow_budget = slow_checks_per_minute
        self._clock = clock
        self._key = secrets.token_bytes(32)
        self._lock = threading.Lock()
        self._known: OrderedDict[bytes, tuple[TokenRecord | None, float]] = OrderedDict()
        """Keyed hash of a token -> its row (None: not a token) and when it was read."""
        self._verified: dict[bytes, str] = {}  # keyed hash of a chosen token -> its id
        self._failures: OrderedDict[bytes, frozenset[str]] = OrderedDict()
        self._slow_spent: dict[str, deque[float]] = {}
        self._slow_running = threading.Lock()
        self._chosen: tuple[frozenset[str], float] | None = None
        self._seen_changes = store.token_changes
        self.slow_checks = 0
        """scrypt comparisons run, for tests and the benchmark."""

    def __call__(self, token: str, client: str | None = None) -> Principal | None:
        return self.authenticate(token, client)

    def trust(self, token: str) -> None:
        """Verify a chosen token this process was started with now, so no call waits on it."""
        self.authenticate(token, client=None, slow_allowed=True)

    def authenticate(
        self, token: str, client: str | None = None, *, slow_allowed: bool = False
    ) -> Principal | None:
        if self._local_admin is not None and hmac.compare_digest(token.encode(), self._local_admin):
            return LOCAL_ADMIN
        record = self._record(token, client, slow_allowed)
        if record is None or record.refused_because(time.time()) is not None:
            return None
        kind = record.kind if record.kind in TOKEN_KINDS else None
        if kind is None:
            return None
        return Principal(kind, record.id, record.worker_id)

    def _record(self, token: str, client: str | None, slow_allowed: bool) -> TokenRecord | None:
        keyed = hmac.new(self._key, token.encode(), hashlib.sha256).digest()
        now = self._clock()
        with self._lock:
            if self.store.token_changes != self._seen_changes:
                self._seen_changes = self.store.token_changes
                self._known.clear()
                self._chosen = None
            cached = self._known.get(keyed)
            verified = self._verified.get(keyed)
        if cached is not None and now - cached[1] < self._fresh:
            return cached[0]
        if verified is not None:
            try:
                record: TokenRecord | None = self.store.get_token(verified)
            except NotFoundError:
                record = None
        else:
            fast = hash_token(token)
            record = self.store.token_by_hash(fast)
            if record is None and not is_generated(token):
                matched = self._scrypt_match(token, keyed, client, slow_allowed)
                if matched is _UNCHECKED:
                    return None  # no verdict, so nothing to remember for other callers
                record = matched
            elif (
                record is not None
                and record.scheme == "sha256"
                and record.kind == "admin"
                and not is_generated(token)
            ):
                self._upgrade_to_scrypt(token, record)
        with self._lock:
            self._known[keyed] = (record, now)
            self._known.move_to_end(keyed)
            while len(self._known) > _REMEMBERED:
                self._known.popitem(last=False)
        return record

    def _unverified_chosen(self, now: float) -> frozenset[str]:
        """Ids of live chosen tokens this process has not verified (read at most each second)."""
        with self._lock:
            chosen = self._chosen
        if chosen is None or now - chosen[1] >= self._fresh:
            ids = frozenset(c.id for c in self.store.scrypt_tokens())
            chosen = (ids, now)
            with self._lock:
                self._chosen = chosen
        with self._lock:
            return chosen[0] - frozenset(self._verified.values())

    def _scrypt_match(
        self, token: str, keyed: bytes, client: str | None, slow_allowed: bool
    ) -> TokenRecord | _Unchecked | None:
        """The chosen token that ``token`` matches; None when it matches none; _UNCHECKED
        when this caller's allowance, or another scrypt running, left it unjudged."""
        now = self._clock()
        pending = self._unverified_chosen(now)
        if not pending:
            return None  # every chosen token is known here: the lookups said it all
        with self._lock:
            if self._failures.get(keyed) == pending:
                return None  # the same wrong token again, and no new chosen token since
        if not slow_allowed and not self._spend_slow_check(client or "", now):
            return _UNCHECKED
        if not self._slow_running.acquire(blocking=slow_allowed):
            return _UNCHECKED  # one scrypt at a time: the others are refused, not queued
        try:
            self.slow_checks += 1
            for candidate in self.store.scrypt_tokens():
                if candidate.id not in pending or not (candidate.salt and candidate.digest):
                    continue
                if scrypt_matches(token, candidate.salt, candidate.digest):
                    with self._lock:
                        self._verified[keyed] = candidate.id
                    return candidate
        finally:
            self._slow_running.release()
        with self._lock:
            self._failures[keyed] = pending
            while len(self._failures) > _REMEMBERED:
                self._failures.popitem(last=False)
        return None

    def _spend_slow_check(self, client: str, now: float) -> bool:
        with self._lock:
            spent = self._slow_spent.setdefault(client, deque())
            while spent and now - spent[0] >= 60.0:
                spent.popleft()
            if len(spent) >= self._slow_budget:
                return False
            spent.append(now)
            if len(self._slow_spent) > _REMEMBERED:
                self._slow_spent = {c: d for c, d in self._slow_spent.items() if d}
            return True

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
            self._verified[hmac.new(self._key, token.encode(), hashlib.sha256).digest()] = record.id
