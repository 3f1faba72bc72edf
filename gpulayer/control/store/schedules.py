"""Schedules, their sources, and the record of each tick."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import (
    Connection,
    and_,
    bindparam,
    func,
    insert,
    select,
    update,
)

from gpulayer.control import tables as t
from gpulayer.control.store.engine import StoreBase
from gpulayer.control.store.records import (
    LIVE_STATES,
    TERMINAL_STATES,
    JobRecord,
    ScheduleRecord,
    ScheduleRunRecord,
    job_from_row,
    schedule_from_row,
    schedule_run_from_row,
)
from gpulayer.errors import NotFoundError

_ADVANCE_WATERMARK = (
    update(t.schedules)
    .where(
        and_(
            t.schedules.c.id == bindparam("schedule"),
            t.schedules.c.watermark < bindparam("to"),
        )
    )
    .values(watermark=bindparam("to"))
)
_LIVE_SCHEDULE_JOBS = (
    select(t.jobs.c.id)
    .select_from(t.schedule_runs.join(t.jobs, t.jobs.c.id == t.schedule_runs.c.job_id))
    .where(
        and_(
            t.schedule_runs.c.schedule_id == bindparam("schedule"),
            t.jobs.c.state.in_(sorted(LIVE_STATES)),
        )
    )
    .order_by(t.jobs.c.created_at)
)


class ScheduleStore(StoreBase):
    # --- schedules and their runs -----------------------------------------------------------

    def insert_schedule(self, **values: Any) -> ScheduleRecord:
        now = time.time()
        values = {**values, "spec": json.dumps(values["spec"])}
        values.setdefault("watermark", now)
        with self._begin() as conn:
            conn.execute(insert(t.schedules).values(created_at=now, updated_at=now, **values))
        return self.get_schedule(values["id"])

    def update_schedule(self, schedule_id: str, **values: Any) -> bool:
        if "spec" in values:
            values["spec"] = json.dumps(values["spec"])
        with self._begin() as conn:
            changed = conn.execute(
                update(t.schedules)
                .where(t.schedules.c.id == schedule_id)
                .values(updated_at=time.time(), **values)
            ).rowcount
        return bool(changed == 1)

    def get_schedule(self, schedule_id: str) -> ScheduleRecord:
        with self.engine.connect() as conn:
            row = conn.execute(select(t.schedules).where(t.schedules.c.id == schedule_id)).first()
        if row is None:
            raise NotFoundError(f"schedule {schedule_id!r} not found")
        return schedule_from_row(row)

    def find_schedule(self, name: str) -> ScheduleRecord:
        with self.engine.connect() as conn:
            row = conn.execute(select(t.schedules).where(t.schedules.c.name == name)).first()
        if row is None:
            raise NotFoundError(f"NAME: no schedule named {name!r}")
        return schedule_from_row(row)

    def list_schedules(self) -> list[ScheduleRecord]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(t.schedules).order_by(t.schedules.c.name))
            return [schedule_from_row(r) for r in rows]

    def schedule_heads(self) -> list[tuple[str, float, float]]:
        """(id, updated_at, watermark) of every schedule: what the firing loop reads each pass."""
        query = select(t.schedules.c.id, t.schedules.c.updated_at, t.schedules.c.watermark)
        with self.engine.connect() as conn:
            return [(r[0], r[1], r[2]) for r in conn.execute(query)]

    def count_active_schedules(self) -> int:
        query = (
            select(func.count()).select_from(t.schedules).where(t.schedules.c.suspend == False)  # noqa: E712 (SQL, not Python)
        )
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def put_schedule_source(self, schedule_id: str, bundle: bytes | None) -> None:
        with self._begin() as conn:
            conn.execute(
                t.schedule_sources.delete().where(t.schedule_sources.c.schedule_id == schedule_id)
            )
            if bundle is not None:
                conn.execute(
                    insert(t.schedule_sources).values(schedule_id=schedule_id, bundle=bundle)
                )

    def schedule_source(self, schedule_id: str) -> bytes | None:
        query = select(t.schedule_sources.c.bundle).where(
            t.schedule_sources.c.schedule_id == schedule_id
        )
        with self.engine.connect() as conn:
            found = conn.execute(query).scalar()
        return None if found is None else bytes(found)

    def delete_schedule(self, schedule_id: str) -> None:
        with self._begin() as conn:
            conn.execute(
                t.schedule_sources.delete().where(t.schedule_sources.c.schedule_id == schedule_id)
            )
            conn.execute(
                t.schedule_runs.delete().where(t.schedule_runs.c.schedule_id == schedule_id)
            )
            conn.execute(t.schedules.delete().where(t.schedules.c.id == schedule_id))

    def record_tick(
        self,
        schedule_id: str,
        tick: float,
        *,
        outcome: str,
        message: str | None = None,
        manual: bool = False,
        job: dict[str, Any] | None = None,
        within: Connection | None = None,
    ) -> bool:
        """Decide a tick once: its run row, the job it creates (a `job_row`), and the
        schedule's watermark, in one transaction (``within``: that of `schedule_locked`).
        False when the tick was decided already (another control plane, or before a
        restart): then nothing is written."""
        from sqlalchemy.exc import IntegrityError

        run = {
            "schedule_id": schedule_id,
            "tick": tick,
            "manual": manual,
            "outcome": outcome,
            "job_id": None if job is None else job["id"],
            "message": message,
            "created_at": time.time(),
        }

        # Statements with their values passed apart compile once and are reused: the firing
        # loop of a control plane with a thousand schedules runs this many times a second.
        def write(conn: Connection) -> None:
            if job is not None:
                conn.execute(insert(t.jobs), job)
                conn.execute(insert(t.log_usage), {"job_id": job["id"], "bytes": 0, "cut_bytes": 0})
            conn.execute(insert(t.schedule_runs), run)
            if not manual:
                conn.execute(_ADVANCE_WATERMARK, {"schedule": schedule_id, "to": tick})

        try:
            if within is not None:
                with within.begin_nested():  # a refused insert leaves the lock held
                    write(within)
            else:
                with self._begin() as conn:
                    write(conn)
        except IntegrityError:
            return False
        return True

    @contextmanager
    def schedule_locked(self, schedule_id: str) -> Iterator[Connection]:
        """A transaction that holds the schedule against every other decider (in this process
        or another server over the same database) until it commits: what is decided from a
        look at the store inside it (the budget spent, the live runs) still holds when the
        run it decides on is written with ``record_tick(within=...)``.

        PostgreSQL locks the schedule's row (SELECT ... FOR UPDATE); SQLite, which locks the
        whole database, takes its write lock at once (BEGIN IMMEDIATE). Reads on other
        connections meanwhile see what was committed before the lock was taken."""
        # In this process, SQLite writers take turns on the writer lock: held here too, the
        # others wait on it rather than on SQLite's busy timeout.
        with self._writer or contextlib.nullcontext(), self.engine.connect() as conn:
            if conn.dialect.name == "sqlite":
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            else:
                conn.execute(
                    select(t.schedules.c.id)
                    .where(t.schedules.c.id == schedule_id)
                    .with_for_update()
                )
            try:
                yield conn
            except BaseException:
                conn.rollback()
                raise
            conn.commit()

    def advance_watermark(self, schedule_id: str, tick: float) -> None:
        with self._begin() as conn:
            conn.execute(_ADVANCE_WATERMARK, {"schedule": schedule_id, "to": tick})

    def schedule_runs(self, schedule_id: str, *, limit: int = 50) -> list[ScheduleRunRecord]:
        """Newest first, each with its job's state when it made one."""
        query = (
            select(t.schedule_runs, t.jobs.c.state.label("job_state"))
            .select_from(t.schedule_runs.outerjoin(t.jobs, t.jobs.c.id == t.schedule_runs.c.job_id))
            .where(t.schedule_runs.c.schedule_id == schedule_id)
            .order_by(t.schedule_runs.c.tick.desc())
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return [schedule_run_from_row(r) for r in conn.execute(query)]

    def live_schedule_jobs(self, schedule_id: str) -> list[str]:
        with self.engine.connect() as conn:
            return [r[0] for r in conn.execute(_LIVE_SCHEDULE_JOBS, {"schedule": schedule_id})]

    def schedule_jobs_since(self, schedule_id: str, since: float) -> list[JobRecord]:
        """The schedule's jobs still live or ended at or after `since` (a budget period)."""
        query = (
            select(t.jobs)
            .select_from(t.schedule_runs.join(t.jobs, t.jobs.c.id == t.schedule_runs.c.job_id))
            .where(
                and_(
                    t.schedule_runs.c.schedule_id == schedule_id,
                    (t.jobs.c.finished_at == None) | (t.jobs.c.finished_at >= since),  # noqa: E711
                )
            )
        )
        with self.engine.connect() as conn:
            return [job_from_row(r) for r in conn.execute(query)]

    def prune_schedule_runs(self, schedule_id: str, keep: int) -> int:
        """Forget ended runs beyond the newest `keep`; live runs always stay."""
        runs = self.schedule_runs(schedule_id, limit=keep + 1000)
        ended = [r for r in runs if r.job_state is None or r.job_state in TERMINAL_STATES]
        doomed = [r.id for r in ended[keep:]]
        if not doomed:
            return 0
        with self._begin() as conn:
            conn.execute(t.schedule_runs.delete().where(t.schedule_runs.c.id.in_(doomed)))
        return len(doomed)
