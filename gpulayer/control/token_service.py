"""API tokens as an aggregate of their own: issue admin and join tokens, list and revoke them.

Built by the composition root with the store it needs (control/service.py builds it beside the
control service); the HTTP routes and the cloud lifecycle's worker credentials come here.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpulayer.control.auth import PrincipalKind, issue_token
from gpulayer.control.store import Store
from gpulayer.control.store.once_keys import OnceKey
from gpulayer.control.store.records import TokenRecord
from gpulayer.control.tokens import hash_token
from gpulayer.errors import UsageError


class TokenService:
    def __init__(self, store: Store) -> None:
        self.store = store

    def create(
        self,
        kind: str,
        name: str = "",
        *,
        expires_at: float | None = None,
        max_workers: int | None = None,
        once: OnceKey | None = None,
    ) -> str:
        """A new admin or join token ("worker" is the API's older name for a join token)."""
        principal: PrincipalKind
        if kind in ("worker", "join"):
            principal = "join"
        elif kind == "admin":
            principal = "admin"
        else:
            raise UsageError(f"kind: admin or worker, not {kind!r}")
        token, _ = issue_token(
            self.store, principal, name, expires_at=expires_at, max_workers=max_workers, once=once
        )
        return token

    def worker_credential(self, name: str) -> tuple[str, str]:
        """A new join token for a machine's worker, and the hash the store keeps of it."""
        token = self.create("worker", name)
        return token, hash_token(token)

    def listed(self, kinds: Sequence[str] | None) -> list[TokenRecord]:
        return self.store.list_tokens(kinds=kinds)

    def revoke(self, token_id: str) -> int:
        """Revoke it and the worker credentials registered through it: how many ended.
        NotFoundError for a token never issued."""
        self.store.get_token(token_id)
        return self.store.revoke_token(token_id)
