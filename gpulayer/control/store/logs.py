"""Job logs (with the per-job size cap) and output artifacts."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    and_,
    bindparam,
    func,
    insert,
    or_,
    select,
    update,
)

from gpulayer.control import tables as t
from gpulayer.control.store.engine import StoreBase
from gpulayer.control.store.records import (
    LogLine,
)

# What every finish report and every log read make, built once: a statement built per call
# costs several times what SQLite takes to run it.
_INSERT_LOGS = insert(t.logs)
_COUNT_LOG_BYTES = (
    update(t.log_usage)
    .where(t.log_usage.c.job_id == bindparam("b_job"))
    .values(bytes=t.log_usage.c.bytes + bindparam("b_added"))
    .returning(t.log_usage.c.bytes)
)
_LOG_PAGE = (
    select(t.logs)
    .where(and_(t.logs.c.job_id == bindparam("b_job"), t.logs.c.id > bindparam("b_after")))
    .order_by(t.logs.c.id)
    .limit(bindparam("b_limit"))
)


class LogStore(StoreBase):
    # --- logs -------------------------------------------------------------------------------

    def append_logs(
        self,
        job_id: str,
        attempt: int,
        lines: Sequence[tuple[str, str]],
        *,
        node: int | None = None,
    ) -> None:
        """Add lines to a job's log; past the log cap its oldest lines go (see log_cap)."""
        if not lines:
            return
        with self._begin() as conn:
            self._append_logs_in(conn, job_id, attempt, lines, node=node, now=time.time())

    def _append_logs_in(
        self,
        conn: Any,
        job_id: str,
        attempt: int,
        lines: Sequence[tuple[str, str]],
        *,
        node: int | None,
        now: float,
    ) -> None:
        """append_logs within a write transaction the caller holds."""
        rows = [
            {
                "job_id": job_id,
                "attempt": attempt,
                "stream": s,
                "text": text,
                "at": now,
                "node": node,
            }
            for s, text in lines
        ]
        added = sum(len(text.encode("utf-8", "replace")) for _, text in lines)
        conn.execute(_INSERT_LOGS, rows)
        held = self._count_log_bytes(conn, job_id, added)
        if held > self.max_log_bytes:
            self._cut_log(conn, job_id, attempt, held)

    def append_logs_many(
        self, batches: Sequence[tuple[str, int, Sequence[tuple[str, str]]]]
    ) -> None:
        """append_logs for several jobs: (job id, attempt, lines) each."""
        for job_id, attempt, lines in batches:
            self.append_logs(job_id, attempt, lines)

    def read_logs(
        self,
        job_id: str,
        *,
        after: int = 0,
        limit: int = 2000,
        max_bytes: int = 4 << 20,
        node: int | None = None,
    ) -> list[LogLine]:
        """Lines after the given id: at most ``limit`` of them and, past the first, about
        ``max_bytes`` of text, so that a page of long lines stays a page. With ``node``, only
        that gang node's own lines."""
        params = {"b_job": job_id, "b_after": after, "b_limit": limit}
        query = _LOG_PAGE
        if node is not None:
            query = query.where(t.logs.c.node == node)
        page: list[LogLine] = []
        size = 0
        with self.engine.connect() as conn:
            for r in conn.execute(query, params):
                if page and size + len(r.text) > max_bytes:
                    break
                page.append(LogLine(r.id, r.attempt, r.stream, r.text, r.at, r.node))
                size += len(r.text)
        return page

    def attempt_stdout_starting(self, job_id: str, attempt: int, prefix: str) -> list[str]:
        """An attempt's stdout rows that start with ``prefix``, in order (node 0's in a gang):
        what a job printed for the control plane to read back."""
        logs = t.logs
        query = (
            select(logs.c.text)
            .where(
                logs.c.job_id == job_id,
                logs.c.attempt == attempt,
                logs.c.stream == "stdout",
                or_(logs.c.node.is_(None), logs.c.node == 0),
                logs.c.text.startswith(prefix, autoescape=True),
            )
            .order_by(logs.c.id)
        )
        with self.engine.connect() as conn:
            return [str(text) for (text,) in conn.execute(query)]

    def setup_spans(self, job_id: str, prefix: str) -> dict[int, tuple[float, float]]:
        """Per attempt, when its setup's first and last lines (those starting with ``prefix``)
        arrived: the setup phase, read from the log rather than kept twice."""
        logs = t.logs
        query = (
            select(logs.c.attempt, func.min(logs.c.at), func.max(logs.c.at))
            .where(
                logs.c.job_id == job_id,
                logs.c.stream == "system",
                logs.c.text.startswith(prefix, autoescape=True),
            )
            .group_by(logs.c.attempt)
        )
        with self.engine.connect() as conn:
            return {int(a): (float(lo), float(hi)) for a, lo, hi in conn.execute(query)}

    def _count_log_bytes(self, conn: Any, job_id: str, added: int) -> int:
        """Add to the job's byte count (its log_usage row, made with the job); the new count."""
        usage = t.log_usage
        # One statement: the raise and the new count together (RETURNING: SQLite 3.35+, PG).
        held = conn.execute(_COUNT_LOG_BYTES, {"b_job": job_id, "b_added": added}).scalar()
        if held is None:  # a job stored before log_usage existed
            conn.execute(insert(usage).values(job_id=job_id, bytes=added, cut_bytes=0))
            return added
        return int(held)

    def _cut_log(self, conn: Any, job_id: str, attempt: int, held: int) -> None:
        """Drop the oldest lines until the log is back under the cap, and put one marker where
        they were (under the last dropped line's id, so it reads first)."""
        from sqlalchemy import LargeBinary, cast

        from gpulayer.control.log_cap import cut_marker, cut_target

        if self.engine.dialect.name == "postgresql":
            size = func.octet_length(t.logs.c.text)
        else:
            size = func.length(cast(t.logs.c.text, LargeBinary))
        excess = held - cut_target(self.max_log_bytes)
        removed = 0
        last_id = None
        after = 0
        while removed < excess:
            chunk = conn.execute(
                select(t.logs.c.id, size)
                .where(and_(t.logs.c.job_id == job_id, t.logs.c.id > after))
                .order_by(t.logs.c.id)
                .limit(2000)
            ).all()
            if not chunk:
                break
            for row_id, row_bytes in chunk:
                after = row_id
                if removed >= excess:
                    break
                removed += int(row_bytes or 0)
                last_id = row_id
        if last_id is None:
            return
        usage = t.log_usage
        cut_before = conn.execute(
            select(usage.c.cut_bytes).where(usage.c.job_id == job_id)
        ).scalar_one()
        # An earlier marker is among the dropped lines: its bytes were never counted.
        marker_bytes = conn.execute(
            select(func.coalesce(func.sum(size), 0)).where(
                and_(
                    t.logs.c.job_id == job_id,
                    t.logs.c.id <= last_id,
                    t.logs.c.stream == "system",
                    t.logs.c.text.startswith("[gpulayer] log cut:"),
                )
            )
        ).scalar_one()
        conn.execute(t.logs.delete().where(and_(t.logs.c.job_id == job_id, t.logs.c.id <= last_id)))
        cut_total = int(cut_before) + removed - int(marker_bytes)
        conn.execute(
            insert(t.logs).values(
                id=last_id,
                job_id=job_id,
                attempt=attempt,
                stream="system",
                text=cut_marker(cut_total, self.max_log_bytes),
                at=time.time(),
            )
        )
        conn.execute(
            update(usage)
            .where(usage.c.job_id == job_id)
            .values(bytes=usage.c.bytes - removed + int(marker_bytes), cut_bytes=cut_total)
        )

    # --- artifacts --------------------------------------------------------------------------

    def record_artifacts(self, job_id: str, entries: Sequence[tuple[str, int, str]]) -> None:
        with self._begin() as conn:
            conn.execute(t.artifacts.delete().where(t.artifacts.c.job_id == job_id))
            if entries:
                conn.execute(
                    insert(t.artifacts),
                    [{"job_id": job_id, "path": p, "size": s, "sha256": h} for p, s, h in entries],
                )

    def record_node_artifacts(
        self, job_id: str, entries: Sequence[tuple[str, int, str]], *, prefix: str
    ) -> None:
        """One gang node's outputs: those under ``prefix`` (node-<r>/), or for node 0 ("")
        all but the other nodes' folders, are replaced by ``entries``."""
        path = t.artifacts.c.path
        if prefix:
            mine: ColumnElement[bool] = path.startswith(prefix, autoescape=True)
        else:
            mine = ~path.like("node-%/%")
        with self._begin() as conn:
            conn.execute(t.artifacts.delete().where(and_(t.artifacts.c.job_id == job_id, mine)))
            if entries:
                conn.execute(
                    insert(t.artifacts),
                    [{"job_id": job_id, "path": p, "size": s, "sha256": h} for p, s, h in entries],
                )

    def list_artifacts(self, job_id: str) -> list[dict[str, Any]]:
        query = (
            select(t.artifacts).where(t.artifacts.c.job_id == job_id).order_by(t.artifacts.c.path)
        )
        with self.engine.connect() as conn:
            return [
                {"path": r.path, "size": r.size, "sha256": r.sha256} for r in conn.execute(query)
            ]
