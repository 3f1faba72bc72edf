"""Persistence for jobs, attempts, logs, workers and artifacts (SQLAlchemy Core).

SQLite by default (WAL, so readers never block the writer and several gpulayer processes can
share one file), PostgreSQL by URL. Every state change that must happen once is a conditional
UPDATE whose row count says whether this caller won.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    and_,
    bindparam,
    case,
    create_engine,
    event,
    func,
    insert,
    or_,
    select,
    true,
    update,
)

from gpulayer.cloud.lifecycle.records import INSTANCE_GONE_STATES, InstanceRecord
from gpulayer.control import tables as t
from gpulayer.control.fair_lock import FairRLock
from gpulayer.control.record_states import RESERVATION_TRANSITIONS, WORKER_TRANSITIONS, sources
from gpulayer.control.schema import SchemaError, bring_up_to_date
from gpulayer.errors import GpulayerError, NotFoundError

TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
LIVE_STATES = frozenset({"queued", "provisioning", "running"})


# Built once: a dispatch pass runs these for every job it places, and building the statement
# objects cost more than running them.
_WIN_QUEUED_JOB = (
    update(t.jobs)
    .where(and_(t.jobs.c.id == bindparam("b_job"), t.jobs.c.state == "queued"))
    .values(state="running", attempts=t.jobs.c.attempts + 1, started_at=bindparam("b_now"))
)
_JOB_ATTEMPTS = select(t.jobs.c.attempts).where(t.jobs.c.id == bindparam("b_job"))
_WORKER_EPOCH = select(t.workers.c.epoch).where(t.workers.c.id == bindparam("b_worker"))
_INSERT_ATTEMPT = insert(t.attempts)
_ATTEMPTS_OF_NUMBER = (
    select(t.attempts)
    .where(t.attempts.c.job_id == bindparam("b_job"))
    .where(t.attempts.c.number == bindparam("b_number"))
    .order_by(t.attempts.c.node_rank)
)


class StoreError(GpulayerError):
    """The database cannot be used (newer schema, unreachable server, ...)."""


@dataclass
class JobRecord:
    id: str
    name: str
    spec: dict[str, Any]
    state: str
    reason: str | None
    message: str | None
    exit_code: int | None
    result: Any
    target: str
    working_dir: str | None
    has_bundle: bool
    attempts: int
    cancel_requested: bool
    created_at: float
    started_at: float | None
    finished_at: float | None
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


@dataclass
class AttemptRecord:
    id: int
    job_id: str
    number: int
    worker_id: str | None
    gpu_indices: list[int]
    state: str
    reason: str | None
    exit_code: int | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    worker_epoch: int | None = None
    node_rank: int = 0
    result: Any = None


@dataclass
class WorkerRecord:
    id: str
    name: str
    kind: str
    labels: dict[str, str]
    capabilities: dict[str, Any]
    state: str
    registered_at: float
    last_heartbeat: float
    epoch: int


@dataclass
class TransitionRecord:
    request_id: str
    from_state: str | None
    to_state: str
    reason: str
    at: float


@dataclass
class ReservationRecord:
    request_id: str
    job_id: str
    worker_id: str | None
    state: str
    """pending (its instance is being prepared), bound (the worker joined), released."""
    created_at: float
    bound_at: float | None
    released_at: float | None


@dataclass
class TokenRecord:
    id: str
    kind: str
    name: str
    hash: str
    scheme: str
    salt: str | None
    digest: str | None
    worker_id: str | None
    parent_id: str | None
    created_at: float
    expires_at: float | None
    max_workers: int | None
    registered: int
    revoked_at: float | None

    def refused_because(self, now: float) -> str | None:
        """Why this token no longer works, or None while it does."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        return None


@dataclass
class LogLine:
    id: int
    attempt: int
    stream: str
    text: str
    at: float
    node: int | None = None


@dataclass(frozen=True)
class QueuedHead:
    id: str
    target: str
    created_at: float


def _stored_json(text: str | None, default: Any) -> Any:
    """A JSON column's value; ``default`` for one that does not parse or has the wrong type
    (written by hand or by an older bug), so one bad row cannot fail every listing."""
    if text is None:
        return default
    try:
        value = json.loads(text)
    except ValueError:
        return default
    if default is not None and not isinstance(value, type(default)):
        return default
    return value


def _job(row: Any) -> JobRecord:
    m = row._mapping
    return JobRecord(
        id=m["id"],
        name=m["name"],
        spec=_stored_json(m["spec"], {}),
        state=m["state"],
        reason=m["reason"],
        message=m["message"],
        exit_code=m["exit_code"],
        result=_stored_json(m["result"], None),
        target=m["target"],
        working_dir=m["working_dir"],
        has_bundle=bool(m["has_bundle"]),
        attempts=m["attempts"],
        cancel_requested=bool(m["cancel_requested"]),
        created_at=m["created_at"],
        started_at=m["started_at"],
        finished_at=m["finished_at"],
        labels=_stored_json(m["labels"], {}),
    )


def _attempt(row: Any) -> AttemptRecord:
    m = row._mapping
    return AttemptRecord(
        id=m["id"],
        job_id=m["job_id"],
        number=m["number"],
        worker_id=m["worker_id"],
        gpu_indices=json.loads(m["gpu_indices"]),
        state=m["state"],
        reason=m["reason"],
        exit_code=m["exit_code"],
        created_at=m["created_at"],
        started_at=m["started_at"],
        finished_at=m["finished_at"],
        worker_epoch=m["worker_epoch"],
        node_rank=m["node_rank"] or 0,
        result=json.loads(m["result"]) if m["result"] is not None else None,
    )


def _worker(row: Any) -> WorkerRecord:
    m = row._mapping
    return WorkerRecord(
        id=m["id"],
        name=m["name"],
        kind=m["kind"],
        labels=json.loads(m["labels"]),
        capabilities=json.loads(m["capabilities"]),
        state=m["state"],
        registered_at=m["registered_at"],
        last_heartbeat=m["last_heartbeat"],
        epoch=m["epoch"],
    )


def job_row(
    *,
    job_id: str,
    name: str,
    spec: dict[str, Any],
    state: str,
    target: str,
    working_dir: str | None,
    has_bundle: bool,
    labels: dict[str, str],
    reason: str | None = None,
    message: str | None = None,
) -> dict[str, Any]:
    """The jobs row of a new job."""
    now = time.time()
    return {
        "id": job_id,
        "name": name,
        "spec": json.dumps(spec),
        "state": state,
        "reason": reason,
        "message": message,
        "target": target,
        "working_dir": working_dir,
        "has_bundle": has_bundle,
        "attempts": 0,
        "cancel_requested": False,
        "created_at": now,
        "finished_at": now if state in TERMINAL_STATES else None,
        "labels": json.dumps(labels),
    }


# Enough to place a burst in a few transactions, few enough that no writer waits long
# behind one.
_ASSIGNMENTS_PER_TRANSACTION = 64


def _assign_in(
    conn: Connection, job_id: str, nodes: Sequence[tuple[str, Sequence[int]]], now: float
) -> list[AttemptRecord] | None:
    """Within a write transaction: the queued job moved to running, with an attempt per node;
    None (and nothing written) when it is no longer queued."""
    won = conn.execute(_WIN_QUEUED_JOB, {"b_job": job_id, "b_now": now}).rowcount
    if won != 1:
        return None
    number = conn.execute(_JOB_ATTEMPTS, {"b_job": job_id}).scalar_one()
    new_attempts = []
    for rank, (worker_id, gpu_indices) in enumerate(nodes):
        epoch = conn.execute(_WORKER_EPOCH, {"b_worker": worker_id}).scalar()
        new_attempts.append(
            {
                "job_id": job_id,
                "number": number,
                "worker_id": worker_id,
                "gpu_indices": json.dumps(list(gpu_indices)),
                "state": "assigned",
                "created_at": now,
                "worker_epoch": epoch,
                "node_rank": rank,
            }
        )
    conn.execute(_INSERT_ATTEMPT, new_attempts)
    rows = conn.execute(_ATTEMPTS_OF_NUMBER, {"b_job": job_id, "b_number": number}).all()
    return [_attempt(r) for r in rows]


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


# As many pooled connections as the HTTP server has worker threads (anyio's default 40) plus
# the control plane's own loops: a request never pays for a new connection (and, on SQLite,
# its PRAGMAs), and a burst never closes connections it will want again at once.
POOL_SIZE = 48
POOL_OVERFLOW = 16


def create_store_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            pool_size=POOL_SIZE,
            max_overflow=POOL_OVERFLOW,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=POOL_SIZE, max_overflow=POOL_OVERFLOW)


def _private_sqlite_files(url: str) -> None:
    """Make a SQLite store's file owner-only before the first connection, and its -wal and
    -shm too: SQLite gives those the database file's own mode when it creates them."""
    import contextlib
    import os

    from sqlalchemy.engine import make_url

    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    try:
        os.close(os.open(database, os.O_WRONLY | os.O_CREAT, 0o600))
    except FileNotFoundError:
        return  # its folder is missing: the connection reports that better
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(database + suffix, 0o600)


class Store:
    def __init__(self, url: str, *, max_log_bytes: int | None = None) -> None:
        from gpulayer.control.log_cap import DEFAULT_MAX_LOG_BYTES

        self.url = url
        self.max_log_bytes = max_log_bytes or DEFAULT_MAX_LOG_BYTES
        if url.startswith("sqlite"):
            _private_sqlite_files(url)
        self.engine = create_store_engine(url)
        # SQLite takes one writer at a time and makes the others sleep and retry (backing off
        # to 100 ms sleeps); taking turns here instead keeps a burst of writes from stalling,
        # and in turn order, so no write waits while later ones go ahead of it.
        self._writer: FairRLock | None = FairRLock() if url.startswith("sqlite") else None
        self.token_changes = 0
        """Bumped whenever this process revokes, removes or rehashes a token, so what
        remembers tokens in memory forgets them at once."""
        self._migrate()

    @contextlib.contextmanager
    def _begin(self) -> Iterator[Connection]:
        """A write transaction (on SQLite, one of this process's at a time)."""
        if self._writer is None:
            with self.engine.begin() as conn:
                yield conn
            return
        with self._writer, self.engine.begin() as conn:
            yield conn

    # --- schema -----------------------------------------------------------------------------

    def _migrate(self) -> None:
        """Bring the schema to this gpulayer's, keeping every row of an older one."""
        try:
            self._bring_up_to_date()
        except SchemaError as exc:
            raise StoreError(str(exc)) from exc

    def _bring_up_to_date(self) -> None:
        if self._writer is None:
            with self.engine.begin() as conn:
                # Two servers starting at once on one PostgreSQL database migrate it once.
                conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7210151)")
                bring_up_to_date(conn)
            return
        with self._writer, self.engine.connect() as conn:
            # SQLite changes a table by copying it, which its foreign keys would refuse while
            # rows of other tables point at it; they are checked once the copy is done.
            conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
            conn.commit()
            try:
                with conn.begin():
                    bring_up_to_date(conn)
                    broken = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
                    if broken:
                        raise StoreError(f"the schema upgrade broke foreign keys: {broken[:3]}")
            finally:
                conn.exec_driver_sql("PRAGMA foreign_keys=ON")
                conn.commit()

    def schema_version(self) -> int:
        with self.engine.connect() as conn:
            return int(
                conn.execute(select(t.meta.c.value).where(t.meta.c.key == "schema")).scalar_one()
            )

    def close(self) -> None:
        self.engine.dispose()

    # --- jobs -------------------------------------------------------------------------------

    def insert_job(self, **fields: Any) -> JobRecord:
        """Insert a new job; `fields` are job_row's."""
        values = job_row(**fields)
        with self._begin() as conn:
            conn.execute(insert(t.jobs).values(**values))
            conn.execute(insert(t.log_usage).values(job_id=values["id"], bytes=0, cut_bytes=0))
        return self.get_job(values["id"])

    def insert_jobs(self, rows: Sequence[dict[str, Any]]) -> list[JobRecord]:
        """Insert several new jobs in one transaction; each row is job_row's fields."""
        if not rows:
            return []
        values = [job_row(**fields) for fields in rows]
        with self._begin() as conn:
            conn.execute(insert(t.jobs), values)
            conn.execute(
                insert(t.log_usage),
                [{"job_id": v["id"], "bytes": 0, "cut_bytes": 0} for v in values],
            )
        return self.get_jobs([v["id"] for v in values])

    def get_jobs(self, job_ids: Sequence[str]) -> list[JobRecord]:
        """These jobs, in the order given (missing ones left out)."""
        found: dict[str, JobRecord] = {}
        with self.engine.connect() as conn:
            for chunk in _chunks(list(job_ids)):
                for row in conn.execute(select(t.jobs).where(t.jobs.c.id.in_(chunk))):
                    found[row.id] = _job(row)
        return [found[job_id] for job_id in job_ids if job_id in found]

    def get_job(self, job_id: str) -> JobRecord:
        with self.engine.connect() as conn:
            row = conn.execute(select(t.jobs).where(t.jobs.c.id == job_id)).first()
        if row is None:
            raise NotFoundError(f"job {job_id!r} not found")
        return _job(row)

    def job_specs(self, job_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The stored specs of these jobs, by id."""
        if not job_ids:
            return {}
        query = select(t.jobs.c.id, t.jobs.c.spec).where(t.jobs.c.id.in_(list(set(job_ids))))
        with self.engine.connect() as conn:
            return {r.id: _stored_json(r.spec, {}) for r in conn.execute(query)}

    def find_job_ids(self, prefix: str) -> list[str]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(t.jobs.c.id).where(t.jobs.c.id.startswith(prefix, autoescape=True)).limit(5)
            )
            return [r[0] for r in rows]

    def list_jobs(self, *, states: Iterable[str] | None = None, limit: int = 50) -> list[JobRecord]:
        query = select(t.jobs).order_by(t.jobs.c.created_at.desc(), t.jobs.c.id.desc()).limit(limit)
        if states is not None:
            query = query.where(t.jobs.c.state.in_(list(states)))
        with self.engine.connect() as conn:
            return [_job(r) for r in conn.execute(query)]

    def queued_jobs(self) -> list[JobRecord]:
        query = (
            select(t.jobs)
            .where(t.jobs.c.state == "queued")
            .order_by(t.jobs.c.created_at, t.jobs.c.id)
        )
        with self.engine.connect() as conn:
            return [_job(r) for r in conn.execute(query)]

    def queued_job_heads(self) -> list[QueuedHead]:
        """Queued jobs' ids, targets and times, FIFO: what a dispatch pass reads every time
        (specs are read once per job, see LivePlacement.specs_of)."""
        query = (
            select(t.jobs.c.id, t.jobs.c.target, t.jobs.c.created_at)
            .where(t.jobs.c.state == "queued")
            .order_by(t.jobs.c.created_at, t.jobs.c.id)
        )
        with self.engine.connect() as conn:
            return [QueuedHead(r.id, r.target, r.created_at) for r in conn.execute(query)]

    def jobs_with_label(
        self, key: str, value: str, *, states: Iterable[str] | None = None
    ) -> list[JobRecord]:
        """Jobs whose labels hold key=value (a job array's members), oldest first."""
        # Labels are stored as JSON text: narrow by its text, then check each row's labels.
        needle = json.dumps({key: value})[1:-1]
        condition = t.jobs.c.labels.contains(needle, autoescape=True)
        if states is not None:
            condition = and_(condition, t.jobs.c.state.in_(list(states)))
        query = select(t.jobs).where(condition).order_by(t.jobs.c.created_at, t.jobs.c.id)
        with self.engine.connect() as conn:
            jobs = [_job(r) for r in conn.execute(query)]
        return [job for job in jobs if job.labels.get(key) == value]

    def count_live_jobs(self) -> int:
        with self.engine.connect() as conn:
            query = select(func.count()).select_from(t.jobs).where(t.jobs.c.state.in_(LIVE_STATES))
            return int(conn.execute(query).scalar_one())

    def update_job(
        self, job_id: str, *, expect_states: Sequence[str] | None = None, **values: Any
    ) -> bool:
        """Change a job; with expect_states only if it is still in one of them. True if changed."""
        if "result" in values and values["result"] is not None:
            values["result"] = json.dumps(values["result"])
        if "spec" in values:
            values["spec"] = json.dumps(values["spec"])
        condition = t.jobs.c.id == job_id
        if expect_states is not None:
            condition = and_(condition, t.jobs.c.state.in_(list(expect_states)))
        with self._begin() as conn:
            return conn.execute(update(t.jobs).where(condition).values(**values)).rowcount == 1

    # --- attempts ---------------------------------------------------------------------------

    def assign(
        self, job_id: str, worker_id: str, gpu_indices: Sequence[int]
    ) -> AttemptRecord | None:
        """Move a queued job to running on a worker, exactly once. None if someone else won."""
        nodes = self.assign_gang(job_id, [(worker_id, gpu_indices)])
        return nodes[0] if nodes else None

    # --- gangs ------------------------------------------------------------------------------

    def assign_gang(
        self, job_id: str, nodes: Sequence[tuple[str, Sequence[int]]]
    ) -> list[AttemptRecord] | None:
        """Move a queued job to running with one attempt per node (node rank = position), all
        in one transaction: every node or none, exactly once. None if someone else won."""
        return self.assign_all([(job_id, nodes)])[0]

    def assign_all(
        self, plans: Sequence[tuple[str, Sequence[tuple[str, Sequence[int]]]]]
    ) -> list[list[AttemptRecord] | None]:
        """assign_gang for each planned job, in order, a few write transactions in all rather
        than one each: a dispatch pass placing hundreds of jobs on SQLite would otherwise
        queue for the writer lock once per job, behind every other writer each time."""
        results: list[list[AttemptRecord] | None] = [None] * len(plans)
        for start in range(0, len(plans), _ASSIGNMENTS_PER_TRANSACTION):
            now = time.time()
            chunk = range(start, min(start + _ASSIGNMENTS_PER_TRANSACTION, len(plans)))
            with self._begin() as conn:
                # In job id order (a stable sort): two servers on one PostgreSQL then lock the
                # jobs' rows in the same order, and neither can wait on the other in a cycle.
                for at in sorted(chunk, key=lambda i: plans[i][0]):
                    job_id, nodes = plans[at]
                    results[at] = _assign_in(conn, job_id, nodes, now)
        return results

    def gang_of(self, attempt: AttemptRecord) -> list[AttemptRecord]:
        """Every node's attempt of the same job and number, by node rank."""
        query = (
            select(t.attempts)
            .where(
                and_(t.attempts.c.job_id == attempt.job_id, t.attempts.c.number == attempt.number)
            )
            .order_by(t.attempts.c.node_rank)
        )
        with self.engine.connect() as conn:
            return [_attempt(r) for r in conn.execute(query)]

    def keep_node_result(self, attempt_id: int, result: Any) -> None:
        with self._begin() as conn:
            conn.execute(
                update(t.attempts)
                .where(t.attempts.c.id == attempt_id)
                .values(result=json.dumps(result))
            )

    def attempts_for(self, job_id: str) -> list[AttemptRecord]:
        query = (
            select(t.attempts)
            .where(t.attempts.c.job_id == job_id)
            .order_by(t.attempts.c.number, t.attempts.c.node_rank)
        )
        with self.engine.connect() as conn:
            return [_attempt(r) for r in conn.execute(query)]

    def active_attempts(self, worker_id: str | None = None) -> list[AttemptRecord]:
        condition: ColumnElement[bool] = t.attempts.c.state.in_(["assigned", "running"])
        if worker_id is not None:
            condition = and_(condition, t.attempts.c.worker_id == worker_id)
        with self.engine.connect() as conn:
            return [_attempt(r) for r in conn.execute(select(t.attempts).where(condition))]

    def cancelled_attempt_ids(self, worker_id: str) -> list[int]:
        """This worker's active attempts whose jobs were asked to cancel, in one query."""
        query = (
            select(t.attempts.c.id)
            .select_from(t.attempts.join(t.jobs, t.jobs.c.id == t.attempts.c.job_id))
            .where(
                and_(
                    t.attempts.c.worker_id == worker_id,
                    t.attempts.c.state.in_(["assigned", "running"]),
                    t.jobs.c.cancel_requested.is_(True),
                )
            )
            .order_by(t.attempts.c.id)
        )
        with self.engine.connect() as conn:
            return [int(row.id) for row in conn.execute(query)]

    def update_attempt(
        self, attempt_id: int, *, expect_states: Sequence[str], **values: Any
    ) -> bool:
        condition = and_(t.attempts.c.id == attempt_id, t.attempts.c.state.in_(list(expect_states)))
        with self._begin() as conn:
            return conn.execute(update(t.attempts).where(condition).values(**values)).rowcount == 1

    def attempt_and_epoch(self, attempt_id: int) -> tuple[AttemptRecord, int | None]:
        """The attempt and its worker's current epoch (None: no such worker), in one query."""
        query = (
            select(t.attempts, t.workers.c.epoch.label("current_epoch"))
            .select_from(t.attempts.outerjoin(t.workers, t.workers.c.id == t.attempts.c.worker_id))
            .where(t.attempts.c.id == attempt_id)
        )
        with self.engine.connect() as conn:
            row = conn.execute(query).first()
        if row is None:
            raise NotFoundError(f"attempt {attempt_id} not found")
        return _attempt(row), row.current_epoch

    def workers_with_assigned(self) -> set[str]:
        """Workers that have an assignment they have not claimed yet."""
        query = select(t.attempts.c.worker_id).where(t.attempts.c.state == "assigned").distinct()
        with self.engine.connect() as conn:
            return {r[0] for r in conn.execute(query) if r[0] is not None}

    def cloud_work_exists(self) -> bool:
        """Whether any live instance or any queued or provisioning cloud job exists."""
        instance = select(t.instances.c.request_id).where(
            t.instances.c.state.not_in(list(INSTANCE_GONE_STATES))
        )
        job = select(t.jobs.c.id).where(
            and_(t.jobs.c.state.in_(["queued", "provisioning"]), t.jobs.c.target == "cloud")
        )
        with self.engine.connect() as conn:
            return (
                conn.execute(instance.limit(1)).first() is not None
                or conn.execute(job.limit(1)).first() is not None
            )

    def get_attempt(self, attempt_id: int) -> AttemptRecord:
        with self.engine.connect() as conn:
            row = conn.execute(select(t.attempts).where(t.attempts.c.id == attempt_id)).first()
        if row is None:
            raise NotFoundError(f"attempt {attempt_id} not found")
        return _attempt(row)

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
        now = time.time()
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
        with self._begin() as conn:
            conn.execute(insert(t.logs), rows)
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
        condition = and_(t.logs.c.job_id == job_id, t.logs.c.id > after)
        if node is not None:
            condition = and_(condition, t.logs.c.node == node)
        query = select(t.logs).where(condition).order_by(t.logs.c.id).limit(limit)
        page: list[LogLine] = []
        size = 0
        with self.engine.connect() as conn:
            for r in conn.execute(query):
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
        held = conn.execute(
            update(usage)
            .where(usage.c.job_id == job_id)
            .values(bytes=usage.c.bytes + added)
            .returning(usage.c.bytes)
        ).scalar()
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

    # --- deleting finished jobs ---------------------------------------------------------------

    def finished_job_ids(self, *, ended_before: float) -> list[str]:
        """Finished jobs that ended (or, lacking an end, were made) before the given time."""
        ended = func.coalesce(t.jobs.c.finished_at, t.jobs.c.created_at)
        query = (
            select(t.jobs.c.id)
            .where(and_(t.jobs.c.state.in_(list(TERMINAL_STATES)), ended < ended_before))
            .order_by(ended, t.jobs.c.id)
        )
        with self.engine.connect() as conn:
            return [r[0] for r in conn.execute(query)]

    def delete_finished_job(self, job_id: str) -> bool:
        """Remove a finished job and every row of it in one transaction. False, with nothing
        removed, when the job is live or still has a cloud instance that is not gone."""
        with self._begin() as conn:
            state = conn.execute(select(t.jobs.c.state).where(t.jobs.c.id == job_id)).scalar()
            if state not in TERMINAL_STATES:
                return False
            live_instances = conn.execute(
                select(func.count())
                .select_from(t.instances)
                .where(
                    and_(
                        t.instances.c.job_id == job_id,
                        t.instances.c.state.not_in(list(INSTANCE_GONE_STATES)),
                    )
                )
            ).scalar_one()
            if live_instances:
                return False
            requests = select(t.instances.c.request_id).where(t.instances.c.job_id == job_id)
            conn.execute(
                t.instance_transitions.delete().where(
                    t.instance_transitions.c.request_id.in_(requests)
                )
            )
            for table in (
                t.logs,
                t.log_usage,
                t.artifacts,
                t.attempts,
                t.reservations,
                t.instances,
            ):
                conn.execute(table.delete().where(table.c.job_id == job_id))
            removed = conn.execute(
                t.jobs.delete().where(
                    and_(t.jobs.c.id == job_id, t.jobs.c.state.in_(list(TERMINAL_STATES)))
                )
            ).rowcount
            return bool(removed == 1)

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
            row = conn.execute(select(t.workers).where(t.workers.c.id == worker_id)).first()
        if row is None:
            raise NotFoundError(f"worker {worker_id!r} not found")
        return _worker(row)

    def list_workers(self) -> list[WorkerRecord]:
        with self.engine.connect() as conn:
            return [_worker(r) for r in conn.execute(select(t.workers).order_by(t.workers.c.id))]

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
            for chunk in _chunks(sorted(set(worker_ids))):
                query = select(t.workers).where(t.workers.c.id.in_(chunk))
                found.extend(_worker(r) for r in conn.execute(query))
        return found

    def active_attempts_on(self, worker_ids: Iterable[str]) -> list[AttemptRecord]:
        """Assigned or running attempts on these workers (the worker-and-state index serves
        it), in batches of bound parameters."""
        found: list[AttemptRecord] = []
        active = t.attempts.c.state.in_(["assigned", "running"])
        with self.engine.connect() as conn:
            for chunk in _chunks(sorted(set(worker_ids))):
                query = select(t.attempts).where(and_(t.attempts.c.worker_id.in_(chunk), active))
                found.extend(_attempt(r) for r in conn.execute(query))
        return found

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

    # --- tokens -----------------------------------------------------------------------------

    def add_token(self, token_hash: str, kind: str, name: str = "", **values: Any) -> TokenRecord:
        """Keep a token's hash (never the token). values: id, scheme, salt, digest, worker_id,
        parent_id, expires_at, max_workers."""
        from gpulayer.control.tokens import new_token_id

        values.setdefault("id", new_token_id())
        with self._begin() as conn:
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
        return _token(row) if row is not None else None

    def get_token(self, token_id: str) -> TokenRecord:
        with self.engine.connect() as conn:
            row = conn.execute(select(t.tokens).where(t.tokens.c.id == token_id)).first()
        if row is None:
            raise NotFoundError(f"token {token_id!r} not found")
        return _token(row)

    def scrypt_tokens(self) -> list[TokenRecord]:
        query = select(t.tokens).where(
            and_(t.tokens.c.scheme == "scrypt", t.tokens.c.revoked_at.is_(None))
        )
        with self.engine.connect() as conn:
            return [_token(r) for r in conn.execute(query)]

    def list_tokens(self, *, kinds: Sequence[str] | None = None) -> list[TokenRecord]:
        query = select(t.tokens).order_by(t.tokens.c.created_at)
        if kinds is not None:
            query = query.where(t.tokens.c.kind.in_(list(kinds)))
        with self.engine.connect() as conn:
            return [_token(r) for r in conn.execute(query)]

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

    # --- instances and the cost ledger ------------------------------------------------------

    def record_instance(self, *, reason: str = "", **values: Any) -> InstanceRecord:
        """Write an instance down before the call that creates it, with its reservation for
        the job and the first entry of its history, in one transaction."""
        return self.record_instances([values], reason=reason)[0]

    def record_instances(
        self, rows: list[dict[str, Any]], *, reason: str = ""
    ) -> list[InstanceRecord]:
        """Several instances (the nodes of a gang) written down together, or none."""
        now = time.time()
        with self._begin() as conn:
            for given in rows:
                values = dict(given)
                values.setdefault("created_at", now)
                values.setdefault("state_since", now)
                values["tags"] = json.dumps(values.get("tags", {}))
                _encode_instance_json(values)
                conn.execute(insert(t.instances).values(**values))
                conn.execute(
                    insert(t.instance_transitions).values(
                        request_id=values["request_id"],
                        from_state=None,
                        to_state=values["state"],
                        reason=reason,
                        at=now,
                    )
                )
                conn.execute(
                    insert(t.reservations).values(
                        request_id=values["request_id"],
                        job_id=values["job_id"],
                        state="pending",
                        created_at=now,
                    )
                )
        return [self.get_instance(row["request_id"]) for row in rows]

    def move_instance(
        self, request_id: str, *, expect: str, to: str, reason: str, **values: Any
    ) -> bool:
        """Move an instance from ``expect`` to ``to`` and note why, only if it is still in
        ``expect``; True when this caller moved it. The caller checks the state table."""
        now = time.time()
        _encode_instance_json(values)
        condition = and_(t.instances.c.request_id == request_id, t.instances.c.state == expect)
        with self._begin() as conn:
            moved = conn.execute(
                update(t.instances).where(condition).values(state=to, state_since=now, **values)
            ).rowcount
            if moved != 1:
                return False
            conn.execute(
                insert(t.instance_transitions).values(
                    request_id=request_id, from_state=expect, to_state=to, reason=reason, at=now
                )
            )
        return True

    def instance_history(self, request_id: str) -> list[TransitionRecord]:
        query = (
            select(t.instance_transitions)
            .where(t.instance_transitions.c.request_id == request_id)
            .order_by(t.instance_transitions.c.id)
        )
        with self.engine.connect() as conn:
            return [
                TransitionRecord(r.request_id, r.from_state, r.to_state, r.reason, r.at)
                for r in conn.execute(query)
            ]

    def reservation(self, request_id: str) -> ReservationRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                select(t.reservations).where(t.reservations.c.request_id == request_id)
            ).first()
        return None if row is None else ReservationRecord(**row._mapping)

    def live_reservations(self, *, job_id: str | None = None) -> list[ReservationRecord]:
        query = select(t.reservations).where(t.reservations.c.state != "released")
        if job_id is not None:
            query = query.where(t.reservations.c.job_id == job_id)
        with self.engine.connect() as conn:
            return [ReservationRecord(**r._mapping) for r in conn.execute(query)]

    def bind_reservation(self, request_id: str, worker_id: str) -> bool:
        """The instance's worker joined: the job now runs on that worker and no other. The
        first worker to register for the instance holds it (it may re-register)."""
        condition = and_(
            t.reservations.c.request_id == request_id,
            or_(
                t.reservations.c.state.in_(sources(RESERVATION_TRANSITIONS, "bound")),
                and_(t.reservations.c.state == "bound", t.reservations.c.worker_id == worker_id),
            ),
        )
        with self._begin() as conn:
            return (
                conn.execute(
                    update(t.reservations)
                    .where(condition)
                    .values(state="bound", worker_id=worker_id, bound_at=time.time())
                ).rowcount
                == 1
            )

    def release_reservation(self, request_id: str) -> None:
        condition = and_(
            t.reservations.c.request_id == request_id,
            t.reservations.c.state.in_(sources(RESERVATION_TRANSITIONS, "released")),
        )
        with self._begin() as conn:
            conn.execute(
                update(t.reservations)
                .where(condition)
                .values(state="released", released_at=time.time())
            )

    def update_instance(self, request_id: str, **values: Any) -> None:
        if "tags" in values:
            values["tags"] = json.dumps(values["tags"])
        _encode_instance_json(values)
        with self._begin() as conn:
            conn.execute(
                update(t.instances).where(t.instances.c.request_id == request_id).values(**values)
            )

    def get_instance(self, request_id: str) -> InstanceRecord:
        with self.engine.connect() as conn:
            row = conn.execute(
                select(t.instances).where(t.instances.c.request_id == request_id)
            ).first()
        if row is None:
            raise NotFoundError(f"instance request {request_id!r} not found")
        return _instance(row)

    def list_instances(
        self, *, job_id: str | None = None, live_only: bool = False
    ) -> list[InstanceRecord]:
        query = select(t.instances).order_by(t.instances.c.created_at)
        if job_id is not None:
            query = query.where(t.instances.c.job_id == job_id)
        if live_only:
            query = query.where(t.instances.c.state.not_in(list(INSTANCE_GONE_STATES)))
        with self.engine.connect() as conn:
            return [_instance(r) for r in conn.execute(query)]

    def instances_holding_offers(self, now: float) -> list[InstanceRecord]:
        """Tries whose offer is held for every job until a time still to come."""
        query = select(t.instances).where(t.instances.c.hold_until > now)
        with self.engine.connect() as conn:
            return [_instance(r) for r in conn.execute(query)]

    def clear_step_retries(self) -> None:
        """Every failed step is tried again at the next pass (``gpulayer cloud reap``)."""
        live = t.instances.c.state.not_in(list(INSTANCE_GONE_STATES))
        with self._begin() as conn:
            conn.execute(
                update(t.instances)
                .where(and_(live, t.instances.c.next_step_at.is_not(None)))
                .values(next_step_at=None)
            )

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
        return _schedule(row)

    def find_schedule(self, name: str) -> ScheduleRecord:
        with self.engine.connect() as conn:
            row = conn.execute(select(t.schedules).where(t.schedules.c.name == name)).first()
        if row is None:
            raise NotFoundError(f"NAME: no schedule named {name!r}")
        return _schedule(row)

    def list_schedules(self) -> list[ScheduleRecord]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(t.schedules).order_by(t.schedules.c.name))
            return [_schedule(r) for r in rows]

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
            return [_schedule_run(r) for r in conn.execute(query)]

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
            return [_job(r) for r in conn.execute(query)]

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
            return [_job(r) for r in conn.execute(query)], count

    def attempts_for_jobs(self, job_ids: Sequence[str]) -> list[AttemptRecord]:
        if not job_ids:
            return []
        query = (
            select(t.attempts)
            .where(t.attempts.c.job_id.in_(list(job_ids)))
            .order_by(t.attempts.c.job_id, t.attempts.c.number)
        )
        with self.engine.connect() as conn:
            return [_attempt(r) for r in conn.execute(query)]

    def instances_for_jobs(self, job_ids: Sequence[str]) -> list[InstanceRecord]:
        if not job_ids:
            return []
        query = select(t.instances).where(t.instances.c.job_id.in_(list(job_ids)))
        with self.engine.connect() as conn:
            return [_instance(r) for r in conn.execute(query)]

    def attempts_since(self, since: float) -> list[AttemptRecord]:
        """Attempts that ran at some point after `since` (still running ones included)."""
        ran_after = (t.attempts.c.finished_at.is_(None)) | (t.attempts.c.finished_at >= since)
        query = select(t.attempts).where(and_(t.attempts.c.started_at.is_not(None), ran_after))
        with self.engine.connect() as conn:
            return [_attempt(r) for r in conn.execute(query)]

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


def _encode_instance_json(values: dict[str, Any]) -> None:
    for name in ("offer", "machine"):
        if values.get(name) is not None:
            values[name] = json.dumps(values[name])


_CHUNK = 500
"""Ids per IN (...) list: well under any database's limit on bound parameters."""


def _chunks(ids: Sequence[str]) -> Iterator[list[str]]:
    for start in range(0, len(ids), _CHUNK):
        yield list(ids[start : start + _CHUNK])


def _token(row: Any) -> TokenRecord:
    m = row._mapping
    return TokenRecord(**{f: m[f] for f in TokenRecord.__dataclass_fields__})


def _instance(row: Any) -> InstanceRecord:
    m = dict(row._mapping)
    m["step_failures"] = m.get("step_failures") or 0
    m["tags"] = json.loads(m["tags"] or "{}")
    m["offer"] = json.loads(m["offer"]) if m.get("offer") else None
    m["machine"] = json.loads(m["machine"]) if m.get("machine") else None
    m["spot"] = bool(m["spot"])
    return InstanceRecord(**m)


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


@dataclass
class ScheduleRecord:
    id: str
    name: str
    spec: dict[str, Any]
    suspend: bool
    working_dir: str | None
    has_bundle: bool
    watermark: float
    created_at: float
    updated_at: float


@dataclass
class ScheduleRunRecord:
    id: int
    schedule_id: str
    tick: float
    manual: bool
    outcome: str
    job_id: str | None
    message: str | None
    created_at: float
    job_state: str | None


def _schedule(row: Any) -> ScheduleRecord:
    m = dict(row._mapping)
    m["spec"] = json.loads(m["spec"])
    m["suspend"] = bool(m["suspend"])
    m["has_bundle"] = bool(m["has_bundle"])
    return ScheduleRecord(**m)


def _schedule_run(row: Any) -> ScheduleRunRecord:
    m = dict(row._mapping)
    m["manual"] = bool(m["manual"])
    return ScheduleRunRecord(**m)
