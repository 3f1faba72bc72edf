"""What the web dashboard reads: pages of jobs, usage, sessions and login links."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    and_,
    func,
    insert,
    select,
    true,
    update,
)

from gpulayer.cloud.lifecycle.records import InstanceRecord
from gpulayer.control import tables as t
from gpulayer.control.store.engine import StoreBase
from gpulayer.control.store.records import (
    AttemptRecord,
    JobRecord,
    attempt_from_row,
    in_chunks,
    instance_from_row,
    job_from_row,
)


class DashboardStore(StoreBase):
    # --- web dashboard: pages of jobs, usage, sessions and login links -----------------------

    def jobs_page(
        self,
        *,
        states: Sequence[str] | None = None,
        labels: dict[str, str] | None = None,
        offset: int = 0,
        limit: int = 50,
    ) -> tuple[list[JobRecord], int]:
        """One page of jobs, newest first, and how many match in all (for the page count)."""
        condition: ColumnElement[bool] = and_(true())
        if states:
            condition = and_(condition, t.jobs.c.state.in_(list(states)))
        for key, value in (labels or {}).items():
            # Labels are kept as json.dumps text: the pair, encoded the same way, is a substring.
            pair = f"{json.dumps(key)}: {json.dumps(value)}"
            condition = and_(condition, t.jobs.c.labels.contains(pair, autoescape=True))
        newest_first = (t.jobs.c.created_at.desc(), t.jobs.c.id.desc())
        # The page's ids first, from the index alone; then only those rows are read whole.
        page_ids = select(t.jobs.c.id).where(condition).order_by(*newest_first)
        page_ids = page_ids.offset(offset).limit(limit)
        query = select(t.jobs).where(t.jobs.c.id.in_(page_ids.scalar_subquery()))
        query = query.order_by(*newest_first)
        with self.engine.connect() as conn:
            total = conn.execute(select(func.count()).select_from(t.jobs).where(condition))
            count = int(total.scalar_one())
            return [job_from_row(r) for r in conn.execute(query)], count

    def attempts_for_jobs(self, job_ids: Sequence[str]) -> list[AttemptRecord]:
        found: list[AttemptRecord] = []
        with self.engine.connect() as conn:
            for chunk in in_chunks(list(job_ids)):
                query = (
                    select(t.attempts)
                    .where(t.attempts.c.job_id.in_(chunk))
                    .order_by(t.attempts.c.job_id, t.attempts.c.number)
                )
                found.extend(attempt_from_row(r) for r in conn.execute(query))
        return found

    def instances_for_jobs(self, job_ids: Sequence[str]) -> list[InstanceRecord]:
        found: list[InstanceRecord] = []
        with self.engine.connect() as conn:
            for chunk in in_chunks(list(job_ids)):
                query = select(t.instances).where(t.instances.c.job_id.in_(chunk))
                found.extend(instance_from_row(r) for r in conn.execute(query))
        return found

    def attempts_since(self, since: float) -> list[AttemptRecord]:
        """Attempts that ran at some point after `since` (still running ones included)."""
        ran_after = (t.attempts.c.finished_at.is_(None)) | (t.attempts.c.finished_at >= since)
        query = select(t.attempts).where(and_(t.attempts.c.started_at.is_not(None), ran_after))
        with self.engine.connect() as conn:
            return [attempt_from_row(r) for r in conn.execute(query)]

    def add_ui_session(
        self, id_hash: str, csrf: str, *, token_id: str | None, expires_at: float
    ) -> None:
        with self._begin() as conn:
            conn.execute(
                insert(t.ui_sessions).values(
                    id_hash=id_hash,
                    csrf=csrf,
                    token_id=token_id,
                    created_at=time.time(),
                    expires_at=expires_at,
                )
            )

    def live_ui_session(self, id_hash: str, now: float) -> dict[str, Any] | None:
        """A session that has neither ended nor expired, or None."""
        query = select(t.ui_sessions).where(
            and_(
                t.ui_sessions.c.id_hash == id_hash,
                t.ui_sessions.c.ended_at.is_(None),
                t.ui_sessions.c.expires_at > now,
            )
        )
        with self.engine.connect() as conn:
            row = conn.execute(query).first()
        return dict(row._mapping) if row is not None else None

    def end_ui_session(self, id_hash: str) -> bool:
        with self._begin() as conn:
            ended = conn.execute(
                update(t.ui_sessions)
                .where(and_(t.ui_sessions.c.id_hash == id_hash, t.ui_sessions.c.ended_at.is_(None)))
                .values(ended_at=time.time())
            ).rowcount
        return bool(ended)

    def add_login_link(self, code_hash: str, *, token_id: str | None, expires_at: float) -> None:
        now = time.time()
        with self._begin() as conn:
            # Links never used and long expired say nothing worth keeping.
            conn.execute(
                t.ui_login_links.delete().where(t.ui_login_links.c.expires_at < now - 86400)
            )
            conn.execute(
                insert(t.ui_login_links).values(
                    code_hash=code_hash, token_id=token_id, created_at=now, expires_at=expires_at
                )
            )

    def use_login_link(self, code_hash: str, now: float) -> tuple[bool, str | None]:
        """Spend a login link: True for exactly one caller, and only before it expires; with
        the id of the token that made it."""
        condition = and_(
            t.ui_login_links.c.code_hash == code_hash,
            t.ui_login_links.c.used_at.is_(None),
            t.ui_login_links.c.expires_at > now,
        )
        with self._begin() as conn:
            won = conn.execute(
                update(t.ui_login_links).where(condition).values(used_at=now)
            ).rowcount
            token_id = conn.execute(
                select(t.ui_login_links.c.token_id).where(t.ui_login_links.c.code_hash == code_hash)
            ).scalar()
        return bool(won), token_id
