"""Tokens: admin, join and per-worker credentials, stored as salted digests."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    and_,
    func,
    insert,
    select,
    update,
)

from gpulayer.control import tables as t
from gpulayer.control.store.engine import StoreBase
from gpulayer.control.store.once_keys import OnceKey, remember_answer
from gpulayer.control.store.records import (
    TokenRecord,
    token_from_row,
)
from gpulayer.errors import NotFoundError


class TokenStore(StoreBase):
    # --- tokens -----------------------------------------------------------------------------

    def add_token(
        self,
        token_hash: str,
        kind: str,
        name: str = "",
        *,
        once: OnceKey | None = None,
        **values: Any,
    ) -> TokenRecord:
        """Keep a token's hash (never the token). values: id, scheme, salt, digest, worker_id,
        parent_id, expires_at, max_workers; ``once``: the request's idempotency key, kept
        with the token's id (KeyTaken when another request kept it first)."""
        from gpulayer.control.tokens import new_token_id

        values.setdefault("id", new_token_id())
        with self._begin() as conn:
            if once is not None:
                remember_answer(conn, once, [values["id"]])
            conn.execute(
                insert(t.tokens).values(
                    hash=token_hash,
                    kind=kind,
                    name=name,
                    created_at=time.time(),
                    registered=0,
                    **values,
                )
            )
        return self.get_token(values["id"])

    def remove_token(self, token_hash: str) -> None:
        """Delete a token and the worker credentials registered through it."""
        with self._begin() as conn:
            token_id = conn.execute(
                select(t.tokens.c.id).where(t.tokens.c.hash == token_hash)
            ).scalar()
            if token_id is not None:
                conn.execute(t.tokens.delete().where(t.tokens.c.parent_id == token_id))
            conn.execute(t.tokens.delete().where(t.tokens.c.hash == token_hash))
        self.token_changes += 1

    def token_by_hash(self, token_hash: str) -> TokenRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(t.tokens).where(t.tokens.c.hash == token_hash)).first()
        return token_from_row(row) if row is not None else None

    def get_token(self, token_id: str) -> TokenRecord:
        with self.engine.connect() as conn:
            row = conn.execute(select(t.tokens).where(t.tokens.c.id == token_id)).first()
        if row is None:
            raise NotFoundError(f"token {token_id!r} not found")
        return token_from_row(row)

    def scrypt_tokens(self) -> list[TokenRecord]:
        query = select(t.tokens).where(
            and_(t.tokens.c.scheme == "scrypt", t.tokens.c.revoked_at.is_(None))
        )
        with self.engine.connect() as conn:
            return [token_from_row(r) for r in conn.execute(query)]

    def list_tokens(self, *, kinds: Sequence[str] | None = None) -> list[TokenRecord]:
        query = select(t.tokens).order_by(t.tokens.c.created_at)
        if kinds is not None:
            query = query.where(t.tokens.c.kind.in_(list(kinds)))
        with self.engine.connect() as conn:
            return [token_from_row(r) for r in conn.execute(query)]

    def upgrade_token_hash(self, token_id: str, **values: Any) -> None:
        with self._begin() as conn:
            conn.execute(update(t.tokens).where(t.tokens.c.id == token_id).values(**values))
        self.token_changes += 1

    def revoke_token(self, token_id: str) -> int:
        """Revoke a token and the worker credentials registered through it; how many ended."""
        now = time.time()
        with self._begin() as conn:
            live = and_(t.tokens.c.revoked_at.is_(None))
            ended = conn.execute(
                update(t.tokens)
                .where(and_(live, (t.tokens.c.id == token_id) | (t.tokens.c.parent_id == token_id)))
                .values(revoked_at=now)
            ).rowcount
        self.token_changes += 1
        return int(ended)

    def count_registration(self, token_id: str) -> bool:
        """Use one of a join token's registrations; False when its cap is reached."""
        cap_left = (t.tokens.c.max_workers.is_(None)) | (
            t.tokens.c.registered < t.tokens.c.max_workers
        )
        with self._begin() as conn:
            won = conn.execute(
                update(t.tokens)
                .where(and_(t.tokens.c.id == token_id, cap_left))
                .values(registered=t.tokens.c.registered + 1)
            ).rowcount
        return bool(won)

    def has_admin_token(self) -> bool:
        with self.engine.connect() as conn:
            query = select(func.count()).select_from(t.tokens).where(t.tokens.c.kind == "admin")
            return int(conn.execute(query).scalar_one()) > 0
