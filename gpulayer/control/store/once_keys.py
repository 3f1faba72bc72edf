"""Idempotency keys: what a create request answered, by its caller and the key it sent.

A key's row is written in the same transaction as the records the request creates, so a
request either created its records and its key or neither: a resent request finds the key
and is answered with those records, and of two concurrent duplicates the second one's
transaction fails on the key's primary key and creates nothing.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, delete, insert, select
from sqlalchemy.exc import IntegrityError

from gpulayer.control import tables as t
from gpulayer.control.store.engine import StoreBase
from gpulayer.errors import GpulayerError


@dataclass(frozen=True)
class OnceKey:
    """A create request's key: who sent it, the key, and the sha256 of what it asked for."""

    caller: str
    key: str
    fingerprint: str


@dataclass(frozen=True)
class KeptAnswer:
    fingerprint: str
    ids: list[str]
    created_at: float
    extra: dict[str, Any]
    """What else the first answer said that the records alone do not (a schedule applied:
    whether it was new)."""


class KeyTaken(GpulayerError):
    """Another request with this caller and key created its records first."""


def remember_answer(
    conn: Connection, once: OnceKey, ids: list[str], extra: dict[str, Any] | None = None
) -> None:
    """Within the creating transaction: keep the ids it makes under ``once``. Done before the
    records are written, so a concurrent duplicate waits here (PostgreSQL) or fails here."""
    row = {
        "caller": once.caller,
        "key": once.key,
        "fingerprint": once.fingerprint,
        "answer": json.dumps({**(extra or {}), "ids": ids}),
        "created_at": time.time(),
    }
    try:
        conn.execute(insert(t.idempotency_keys).values(**row))
    except IntegrityError:  # the whole transaction is rolled back as this leaves it
        raise KeyTaken(f"Idempotency-Key {once.key!r} was used by another request") from None


class OnceKeyStore(StoreBase):
    def kept_answer(self, caller: str, key: str, *, since: float) -> KeptAnswer | None:
        """The answer kept for this caller's key, unless it is older than ``since`` (then it
        is forgotten here, so the key may be used afresh)."""
        where = and_(t.idempotency_keys.c.caller == caller, t.idempotency_keys.c.key == key)
        with self.engine.connect() as conn:
            row = conn.execute(select(t.idempotency_keys).where(where)).first()
        if row is None:
            return None
        if row.created_at < since:
            with self._begin() as conn:
                conn.execute(
                    delete(t.idempotency_keys).where(where, t.idempotency_keys.c.created_at < since)
                )
            return None
        answer: dict[str, Any] = json.loads(row.answer)
        ids = [str(i) for i in answer.pop("ids")]
        return KeptAnswer(row.fingerprint, ids, row.created_at, answer)

    def keep_answer(
        self, once: OnceKey, ids: list[str], extra: dict[str, Any] | None = None
    ) -> None:
        """Keep what a request made in several transactions, once they are all over."""
        with self._begin() as conn:
            remember_answer(conn, once, ids, extra)

    def forget_answers_before(self, before: float) -> int:
        """Drop the keys older than ``before``; how many went."""
        query = delete(t.idempotency_keys).where(t.idempotency_keys.c.created_at < before)
        with self._begin() as conn:
            return int(conn.execute(query).rowcount or 0)
