"""The secret store's rows: each secret's ciphertext by scope and name (never a value)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from sqlalchemy import delete, insert, select, update

from gpulayer.control import tables as t
from gpulayer.control.store.engine import StoreBase


class SecretRows(StoreBase):
    def put_secret(self, scope: str, name: str, ciphertext: bytes) -> bool:
        """Keep ``name``'s ciphertext; True when it is new, False when it replaced one."""
        now = time.time()
        where = (t.secrets.c.scope == scope) & (t.secrets.c.name == name)
        with self._begin() as conn:
            changed = conn.execute(
                update(t.secrets).where(where).values(ciphertext=ciphertext, updated_at=now)
            ).rowcount
            if changed:
                return False
            conn.execute(
                insert(t.secrets).values(
                    scope=scope, name=name, ciphertext=ciphertext, created_at=now, updated_at=now
                )
            )
        return True

    def secret_names(self, scope: str) -> list[tuple[str, float, float]]:
        """(name, created_at, updated_at) of each secret of ``scope``, by name."""
        query = (
            select(t.secrets.c.name, t.secrets.c.created_at, t.secrets.c.updated_at)
            .where(t.secrets.c.scope == scope)
            .order_by(t.secrets.c.name)
        )
        with self.engine.connect() as conn:
            return [(r.name, r.created_at, r.updated_at) for r in conn.execute(query)]

    def secret_ciphertexts(self, scope: str, names: Sequence[str]) -> dict[str, bytes]:
        if not names:
            return {}
        query = select(t.secrets.c.name, t.secrets.c.ciphertext).where(
            (t.secrets.c.scope == scope) & t.secrets.c.name.in_(list(names))
        )
        with self.engine.connect() as conn:
            return {r.name: bytes(r.ciphertext) for r in conn.execute(query)}

    def remove_secret(self, scope: str, name: str) -> bool:
        where = (t.secrets.c.scope == scope) & (t.secrets.c.name == name)
        with self._begin() as conn:
            return bool(conn.execute(delete(t.secrets).where(where)).rowcount)
