"""Dashboard sessions: a random cookie whose SHA-256 is kept in the store with its CSRF token
and expiry, so logging out (or a revoked token) ends it on the server, not just in the browser.

One-time login links carry a random code, also kept only as its SHA-256, spent by a conditional
update: a second use, even at the same instant, finds it used.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from gpulayer.control.auth import Principal
from gpulayer.control.store import Store

SESSION_COOKIE = "gpulayer_session"
LOGIN_CSRF_COOKIE = "gpulayer_login_csrf"
SESSION_SECONDS = 12 * 3600.0
LOGIN_LINK_SECONDS = 120.0


@dataclass(frozen=True)
class Session:
    id_hash: str
    csrf: str
    expires_at: float


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def same_secret(given: str | None, expected: str) -> bool:
    return bool(given) and hmac.compare_digest(str(given).encode(), expected.encode())


class SessionKeeper:
    def __init__(self, store: Store, *, lifetime: float = SESSION_SECONDS) -> None:
        self.store = store
        self.lifetime = lifetime

    def open(self, principal: Principal) -> tuple[str, Session]:
        """A new session for an admin; returns the cookie value (shown to the browser only)."""
        if principal.kind != "admin":
            raise ValueError("only an admin opens a dashboard session")
        cookie = secrets.token_urlsafe(32)
        session = Session(_digest(cookie), secrets.token_urlsafe(32), time.time() + self.lifetime)
        self.store.add_ui_session(
            session.id_hash,
            session.csrf,
            token_id=principal.token_id,
            expires_at=session.expires_at,
        )
        return cookie, session

    def find(self, cookie: str | None) -> Session | None:
        """The live session behind a cookie; None when unknown, ended, expired, or when the
        token it was opened with has since been revoked or has expired."""
        if not cookie:
            return None
        now = time.time()
        row = self.store.live_ui_session(_digest(cookie), now)
        if row is None:
            return None
        if row["token_id"] is not None:
            try:
                token = self.store.get_token(row["token_id"])
            except Exception:
                return None
            if token.refused_because(now) is not None:
                return None
        return Session(row["id_hash"], row["csrf"], row["expires_at"])

    def close(self, cookie: str | None) -> bool:
        return bool(cookie) and self.store.end_ui_session(_digest(str(cookie)))

    def new_login_link(self, creator: Principal) -> str:
        """A code for one login, valid for LOGIN_LINK_SECONDS, made by an admin."""
        if creator.kind != "admin":
            raise ValueError("only an admin makes a login link")
        code = secrets.token_urlsafe(32)
        self.store.add_login_link(
            _digest(code), token_id=creator.token_id, expires_at=time.time() + LOGIN_LINK_SECONDS
        )
        return code

    def spend_login_link(self, code: str | None) -> Principal | None:
        """The admin a link logs in as, once; None when unknown, used or expired."""
        if not code:
            return None
        won, token_id = self.store.use_login_link(_digest(code), time.time())
        return Principal("admin", token_id) if won else None
