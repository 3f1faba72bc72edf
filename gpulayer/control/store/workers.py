"""Workers: registration, heartbeats, state moves, and the reads the live placement index
refreshes from."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

from sqlalchemy import (
    and_,
    bindparam,
    case,
    insert,
    select,
    update,
)

from gpulayer.control import tables as t
from gpulayer.control.record_states import WORKER_TRANSITIONS, sources
from gpulayer.control.store.by_ids import ACTIVE_ATTEMPT, by_ids
from gpulayer.control.store.engine import StoreBase
from gpulayer.control.store.records import (
    AttemptRecord,
    WorkerRecord,
    attempt_from_row,
    in_chunks,
    worker_from_row,
)
from gpulayer.errors import NotFoundError

# The reads every claim and every dispatch pass make, built once: a statement built per call
# costs several times what SQLite takes to run it.
_WORKER = select(t.workers).where(t.workers.c.id == bindparam("b_id"))
_WORKER_LIFE = select(t.workers.c.epoch, t.workers.c.kind).where(
    t.workers.c.id == bindparam("b_id")
)
_WORKERS = by_ids(t.workers.c.id, lambda ids: select(t.workers).where(ids))
_ACTIVE_ON = by_ids(
    t.attempts.c.worker_id, lambda ids: select(t.attempts).where(and_(ids, ACTIVE_ATTEMPT))
)


class WorkerStore(StoreBase):
    # --- workers ----------------------------------------------------------------------------

    def upsert_worker(
        self,
        *,
        worker_id: str,
        name: str,
        kind: str,
        labels: dict[str, str],
        capabilities: dict[str, Any],
    ) -> WorkerRecord:
        now = time.time()
        values = {
            "name": name,
            "kind": kind,
            "labels": json.dumps(labels),
            "capabilities": json.dumps(capabilities),
            "state": "ready",
            "last_heartbeat": now,
        }
        with self._begin() as conn:
            existing = conn.execute(
                select(t.workers.c.id).where(t.workers.c.id == worker_id)
            ).first()
            if existing:
                conn.execute(
                    update(t.workers)
                    .where(t.workers.c.id == worker_id)
                    .values(**values, epoch=t.workers.c.epoch + 1)
                )
            else:
                conn.execute(
                    insert(t.workers).values(id=worker_id, registered_at=now, epoch=1, **values)
                )
        return self.get_worker(worker_id)

    def get_worker(self, worker_id: str) -> WorkerRecord:
        with self.engine.connect() as conn:
            row = conn.execute(_WORKER, {"b_id": worker_id}).first()
        if row is None:
            raise NotFoundError(f"worker {worker_id!r} not found")
        return worker_from_row(row)

    def worker_life(self, worker_id: str) -> tuple[int, str]:
        """The worker's epoch (its life) and kind, without reading the rest of its row."""
        with self.engine.connect() as conn:
            row = conn.execute(_WORKER_LIFE, {"b_id": worker_id}).first()
        if row is None:
            raise NotFoundError(f"worker {worker_id!r} not found")
        return int(row.epoch), str(row.kind)

    def list_workers(self) -> list[WorkerRecord]:
        with self.engine.connect() as conn:
            return [
                worker_from_row(r) for r in conn.execute(select(t.workers).order_by(t.workers.c.id))
            ]

    def move_worker(self, worker_id: str, to: str) -> bool:
        """Move a worker into ``to`` from where WORKER_TRANSITIONS allows; True if moved."""
        allowed = sources(WORKER_TRANSITIONS, to)
        condition = and_(t.workers.c.id == worker_id, t.workers.c.state.in_(allowed))
        with self._begin() as conn:
            return conn.execute(update(t.workers).where(condition).values(state=to)).rowcount == 1

    def worker_heartbeat(self, worker_id: str) -> None:
        """The worker is alive now; a lost one is ready again (one statement: the hot path)."""
        revived = case(
            (t.workers.c.state.in_(sources(WORKER_TRANSITIONS, "ready")), "ready"),
            else_=t.workers.c.state,
        )
        with self._begin() as conn:
            conn.execute(
                update(t.workers)
                .where(t.workers.c.id == worker_id)
                .values(last_heartbeat=time.time(), state=revived)
            )

    def set_worker_degraded(self, worker_id: str, reason: str | None) -> None:
        """Note why the worker takes no job now (None: it takes them again). Kept with its
        capabilities, which a registration replaces whole (a new life says anew)."""
        with self._begin() as conn:
            row = conn.execute(
                select(t.workers.c.capabilities).where(t.workers.c.id == worker_id)
            ).first()
            if row is None:
                return
            capabilities = json.loads(row[0])
            if capabilities.get("degraded") == reason:
                return
            capabilities.pop("degraded", None)
            if reason is not None:
                capabilities["degraded"] = reason
            conn.execute(
                update(t.workers)
                .where(t.workers.c.id == worker_id)
                .values(capabilities=json.dumps(capabilities))
            )

    def credit_worker_silence(self, worker_id: str) -> None:
        """Its silence counts from now (the control plane was down); its state stays."""
        with self._begin() as conn:
            conn.execute(
                update(t.workers)
                .where(t.workers.c.id == worker_id)
                .values(last_heartbeat=time.time())
            )

    # --- placement reads: what the live worker index refreshes from -------------------------

    def workers_by_ids(self, worker_ids: Iterable[str]) -> list[WorkerRecord]:
        """These workers' rows (unknown ids are left out), in batches of bound parameters."""
        found: list[WorkerRecord] = []
        with self.engine.connect() as conn:
            for chunk in in_chunks(sorted(set(worker_ids))):
                found.extend(worker_from_row(r) for r in _WORKERS.run(conn, chunk))
        return found

    def active_attempts_on(self, worker_ids: Iterable[str]) -> list[AttemptRecord]:
        """Assigned or running attempts on these workers (the worker-and-state index serves
        it), in batches of bound parameters."""
        found: list[AttemptRecord] = []
        with self.engine.connect() as conn:
            for chunk in in_chunks(sorted(set(worker_ids))):
                rows = _ACTIVE_ON.run(conn, chunk)
                found.extend(attempt_from_row(r) for r in rows)
        return found
