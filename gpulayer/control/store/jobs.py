"""Jobs and their attempts: submitting, assigning (one attempt, or a gang's together), ending,
and deleting finished jobs. Every state change that must happen once is a conditional UPDATE
whose row count says whether this caller won."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterable, Mapping, Sequence
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

from gpulayer.cloud.lifecycle.records import INSTANCE_GONE_STATES
from gpulayer.control import tables as t
from gpulayer.control.store.by_ids import ACTIVE_ATTEMPT, ByIds, by_ids
from gpulayer.control.store.engine import StoreBase
from gpulayer.control.store.once_keys import OnceKey, remember_answer
from gpulayer.control.store.records import (
    LIVE_STATES,
    TERMINAL_STATES,
    AttemptRecord,
    JobRecord,
    QueuedHead,
    attempt_from_row,
    in_chunks,
    job_from_row,
    stored_json,
)
from gpulayer.errors import NotFoundError

# Built once, and two a job: a dispatch pass runs these for every job it places, and building
# or compiling a statement costs more than running it. The win returns the new attempt number;
# the attempts are written and read back in one statement.
_WIN_QUEUED_JOB = (
    update(t.jobs)
    .where(and_(t.jobs.c.id == bindparam("b_job"), t.jobs.c.state == "queued"))
    .values(state="running", attempts=t.jobs.c.attempts + 1, started_at=bindparam("b_now"))
    .returning(t.jobs.c.attempts)
)
_INSERT_ATTEMPTS = insert(t.attempts).returning(*t.attempts.c, sort_by_parameter_order=True)


def job_row(
    *,
    job_id: str,
    name: str,
    spec: dict[str, Any],
    state: str,
    target: str,
    working_dir: str | None,
    labels: dict[str, str],
    reason: str | None = None,
    message: str | None = None,
    bundle_digest: str | None = None,
    has_bundle: bool = False,
) -> dict[str, Any]:
    """The jobs row of a new job; it has a bundle when it names one by digest (``has_bundle``
    alone: a bundle file in its folder, as before schema 10)."""
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
        "has_bundle": has_bundle or bundle_digest is not None,
        "bundle_digest": bundle_digest,
        "attempts": 0,
        "cancel_requested": False,
        "created_at": now,
        "finished_at": now if state in TERMINAL_STATES else None,
        "labels": json.dumps(labels),
    }


_AS_WRITTEN = (
    "id",
    "name",
    "state",
    "reason",
    "message",
    "target",
    "working_dir",
    "bundle_digest",
    "attempts",
    "cancel_requested",
    "created_at",
    "finished_at",
)
"""A new job's fields a read of its row gives back unchanged."""


def _new_job_record(fields: dict[str, Any], row: dict[str, Any]) -> JobRecord:
    """What reading back the row ``job_row(**fields)`` made would give."""
    return JobRecord(
        **{name: row[name] for name in _AS_WRITTEN},
        spec=fields["spec"],
        labels=dict(fields["labels"]),
        has_bundle=bool(row["has_bundle"]),
        exit_code=None,
        result=None,
        started_at=None,
    )


# Enough to place a burst in a few transactions, few enough that no writer waits long
# behind one.
_ASSIGNMENTS_PER_TRANSACTION = 64


def _assign_in(
    conn: Connection,
    job_id: str,
    nodes: Sequence[tuple[str, Sequence[int]]],
    now: float,
    epochs: Mapping[str, int | None],
) -> list[AttemptRecord] | None:
    """Within a write transaction: the queued job moved to running, with an attempt per node
    (each carrying its worker's epoch from ``epochs``, read in the same transaction); None
    (and nothing written) when it is no longer queued."""
    number = conn.execute(_WIN_QUEUED_JOB, {"b_job": job_id, "b_now": now}).scalar()
    if number is None:
        return None
    new_attempts = [
        {
            "job_id": job_id,
            "number": number,
            "worker_id": worker_id,
            "gpu_indices": json.dumps(list(gpu_indices)),
            "state": "assigned",
            "created_at": now,
            "worker_epoch": epochs.get(worker_id),
            "node_rank": rank,
        }
        for rank, (worker_id, gpu_indices) in enumerate(nodes)
    ]
    # One statement made once (a statement built per call is compiled per call).
    params: dict[str, Any] | list[dict[str, Any]] = (
        new_attempts[0] if len(new_attempts) == 1 else new_attempts
    )
    return [attempt_from_row(r) for r in conn.execute(_INSERT_ATTEMPTS, params)]


# The reads and writes each item of a map makes (its claim, its start, its dispatch), built
# once: a statement built per call costs several times what SQLite takes to run it.
_EPOCHS = by_ids(t.workers.c.id, lambda ids: select(t.workers.c.id, t.workers.c.epoch).where(ids))
_JOB = select(t.jobs).where(t.jobs.c.id == bindparam("b_id"))
_JOB_STATE = select(t.jobs.c.state).where(t.jobs.c.id == bindparam("b_id"))
_JOBS = by_ids(t.jobs.c.id, lambda ids: select(t.jobs).where(ids))
_ACTIVE = ACTIVE_ATTEMPT
_ACTIVE_OF_WORKER = select(t.attempts).where(
    and_(_ACTIVE, t.attempts.c.worker_id == bindparam("b_worker"))
)
_CANCELLED_OF_WORKER = (
    select(t.attempts.c.id)
    .select_from(t.attempts.join(t.jobs, t.jobs.c.id == t.attempts.c.job_id))
    .where(
        and_(
            t.attempts.c.worker_id == bindparam("b_worker"),
            _ACTIVE,
            t.jobs.c.cancel_requested.is_(True),
        )
    )
    .order_by(t.attempts.c.id)
)


_ACTIVE_OF_WORKER_WITH_CANCELS = (
    select(t.attempts, t.jobs.c.cancel_requested.label("job_cancel_requested"))
    .select_from(t.attempts.join(t.jobs, t.jobs.c.id == t.attempts.c.job_id))
    .where(and_(t.attempts.c.worker_id == bindparam("b_worker"), _ACTIVE))
    .order_by(t.attempts.c.id)
)


@functools.lru_cache(maxsize=64)
def _attempts_move(columns: tuple[str, ...], one_state: bool) -> ByIds:
    """update_attempts' statements for these columns (moving from one state, or from any of
    several), built once per such shape."""
    state = t.attempts.c.state
    from_ = (
        state == bindparam("b_from")
        if one_state
        else state.in_(bindparam("b_from", expanding=True))
    )
    values: dict[str, Any] = {column: bindparam(f"v_{column}") for column in columns}
    return by_ids(
        t.attempts.c.id,
        lambda ids: (
            update(t.attempts).where(and_(ids, from_)).values(values).returning(t.attempts.c.id)
        ),
    )


def _epochs_in(conn: Connection, worker_ids: Iterable[str]) -> dict[str, int | None]:
    """These workers' epochs as the transaction sees them (a worker without a row: none)."""
    found: dict[str, int | None] = {}
    for chunk in in_chunks(sorted(set(worker_ids))):
        found.update((row.id, row.epoch) for row in _EPOCHS.run(conn, chunk))
    return found


class JobStore(StoreBase):
    # --- jobs -------------------------------------------------------------------------------

    def insert_job(self, *, once: OnceKey | None = None, **fields: Any) -> JobRecord:
        """Insert a new job; `fields` are job_row's; ``once``: the request's idempotency key,
        kept with the job (KeyTaken when another request kept it first)."""
        values = job_row(**fields)
        with self._begin() as conn:
            if once is not None:
                remember_answer(conn, once, [values["id"]])
            conn.execute(insert(t.jobs).values(**values))
            conn.execute(insert(t.log_usage).values(job_id=values["id"], bytes=0, cut_bytes=0))
        return _new_job_record(fields, values)

    def insert_jobs(
        self, rows: Sequence[dict[str, Any]], *, once: OnceKey | None = None
    ) -> list[JobRecord]:
        """Insert several new jobs in one transaction; each row is job_row's fields;
        ``once`` as for insert_job."""
        if not rows:
            return []
        values = [job_row(**fields) for fields in rows]
        with self._begin() as conn:
            if once is not None:
                remember_answer(conn, once, [v["id"] for v in values])
            conn.execute(insert(t.jobs), values)
            conn.execute(
                insert(t.log_usage),
                [{"job_id": v["id"], "bytes": 0, "cut_bytes": 0} for v in values],
            )
        # The rows as written, not read back: nothing else writes a new job's row before its
        # id is handed out, and a list submit stores thousands of them. Each record's spec
        # is the dict given for it.
        return [_new_job_record(fields, v) for fields, v in zip(rows, values, strict=True)]

    def bundle_in_use(self, digest: str) -> bool:
        """Whether any job still names this kept bundle."""
        query = select(t.jobs.c.id).where(t.jobs.c.bundle_digest == digest).limit(1)
        with self.engine.connect() as conn:
            return conn.execute(query).first() is not None

    def get_jobs(self, job_ids: Sequence[str]) -> list[JobRecord]:
        """These jobs, in the order given (missing ones left out)."""
        found: dict[str, JobRecord] = {}
        with self.engine.connect() as conn:
            for chunk in in_chunks(list(job_ids)):
                for row in _JOBS.run(conn, chunk):
                    found[row.id] = job_from_row(row)
        return [found[job_id] for job_id in job_ids if job_id in found]

    def job_state(self, job_id: str) -> str:
        """The job's state alone (NotFoundError when there is no such job)."""
        with self.engine.connect() as conn:
            state = conn.execute(_JOB_STATE, {"b_id": job_id}).scalar()
        if state is None:
            raise NotFoundError(f"job {job_id!r} not found")
        return str(state)

    def get_job(self, job_id: str) -> JobRecord:
        with self.engine.connect() as conn:
            row = conn.execute(_JOB, {"b_id": job_id}).first()
        if row is None:
            raise NotFoundError(f"job {job_id!r} not found")
        return job_from_row(row)

    def job_specs(self, job_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The stored specs of these jobs, by id."""
        if not job_ids:
            return {}
        query = select(t.jobs.c.id, t.jobs.c.spec).where(t.jobs.c.id.in_(list(set(job_ids))))
        with self.engine.connect() as conn:
            return {r.id: stored_json(r.spec, {}) for r in conn.execute(query)}

    def find_job_ids(self, prefix: str) -> list[str]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(t.jobs.c.id).where(t.jobs.c.id.startswith(prefix, autoescape=True)).limit(5)
            )
            return [r[0] for r in rows]

    def list_jobs(self, *, states: Iterable[str] | None = None, limit: int = 50) -> list[JobRecord]:
        """The newest ``limit`` jobs, in ``states`` when given."""
        newest_first = (t.jobs.c.created_at.desc(), t.jobs.c.id.desc())
        if states is None:
            with self.engine.connect() as conn:
                query = select(t.jobs).order_by(*newest_first).limit(limit)
                return [job_from_row(r) for r in conn.execute(query)]
        # A query a state: each walks the (state, created_at) index newest first and stops
        # at ``limit``, where one query over several states sorts every row they hold (a
        # long queue's worth, for a poll asking for the newest live job).
        found: list[JobRecord] = []
        with self.engine.connect() as conn:
            for state in sorted(set(states)):
                query = select(t.jobs).where(t.jobs.c.state == state)
                query = query.order_by(*newest_first).limit(limit)
                found += [job_from_row(r) for r in conn.execute(query)]
        found.sort(key=lambda job: (job.created_at, job.id), reverse=True)
        return found[:limit]

    def queued_jobs(self) -> list[JobRecord]:
        query = (
            select(t.jobs)
            .where(t.jobs.c.state == "queued")
            .order_by(t.jobs.c.created_at, t.jobs.c.id)
        )
        with self.engine.connect() as conn:
            return [job_from_row(r) for r in conn.execute(query)]

    def queued_job_heads(self) -> list[QueuedHead]:
        """Queued jobs' ids, targets and times, FIFO: what a dispatch pass reads every time
        (specs are read once per job, see LivePlacement.specs_of)."""
        query = (
            select(t.jobs.c.id, t.jobs.c.target, t.jobs.c.created_at)
            .where(t.jobs.c.state == "queued")
            .order_by(t.jobs.c.created_at, t.jobs.c.id)
        )
        with self.engine.connect() as conn:
            # Unpacked by position: a row's attribute lookups cost twice the read itself.
            return [QueuedHead(i, target, at) for i, target, at in conn.execute(query)]

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
            jobs = [job_from_row(r) for r in conn.execute(query)]
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
                epochs = _epochs_in(conn, (w for at in chunk for w, _ in plans[at][1]))
                # In job id order (a stable sort): two servers on one PostgreSQL then lock the
                # jobs' rows in the same order, and neither can wait on the other in a cycle.
                for at in sorted(chunk, key=lambda i: plans[i][0]):
                    job_id, nodes = plans[at]
                    results[at] = _assign_in(conn, job_id, nodes, now, epochs)
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
            return [attempt_from_row(r) for r in conn.execute(query)]

    def attempts_for(self, job_id: str) -> list[AttemptRecord]:
        query = (
            select(t.attempts)
            .where(t.attempts.c.job_id == job_id)
            .order_by(t.attempts.c.number, t.attempts.c.node_rank)
        )
        with self.engine.connect() as conn:
            return [attempt_from_row(r) for r in conn.execute(query)]

    def active_attempts(self, worker_id: str | None = None) -> list[AttemptRecord]:
        with self.engine.connect() as conn:
            if worker_id is not None:
                rows = conn.execute(_ACTIVE_OF_WORKER, {"b_worker": worker_id})
            else:
                rows = conn.execute(select(t.attempts).where(_ACTIVE))
            return [attempt_from_row(r) for r in rows]

    def active_attempts_and_cancels(self, worker_id: str) -> tuple[list[AttemptRecord], list[int]]:
        """This worker's active attempts, and the ids of those whose jobs were asked to
        cancel (as cancelled_attempt_ids), in one query: what every claim looks at."""
        with self.engine.connect() as conn:
            rows = conn.execute(_ACTIVE_OF_WORKER_WITH_CANCELS, {"b_worker": worker_id}).all()
        attempts = [attempt_from_row(r) for r in rows]
        return attempts, [
            a.id for a, r in zip(attempts, rows, strict=True) if r.job_cancel_requested
        ]

    def cancelled_attempt_ids(self, worker_id: str) -> list[int]:
        """This worker's active attempts whose jobs were asked to cancel, in one query."""
        with self.engine.connect() as conn:
            rows = conn.execute(_CANCELLED_OF_WORKER, {"b_worker": worker_id})
            return [int(row.id) for row in rows]

    def update_attempt(
        self, attempt_id: int, *, expect_states: Sequence[str], **values: Any
    ) -> bool:
        condition = and_(t.attempts.c.id == attempt_id, t.attempts.c.state.in_(list(expect_states)))
        if "result" in values:
            values["result"] = json.dumps(values["result"])
        with self._begin() as conn:
            return conn.execute(update(t.attempts).where(condition).values(**values)).rowcount == 1

    def update_attempts(
        self, attempt_ids: Sequence[int], *, expect_states: Sequence[str], **values: Any
    ) -> set[int]:
        """update_attempt for several attempts in one statement; the ids it moved."""
        if not attempt_ids:
            return set()
        columns = tuple(sorted(values))
        params: dict[str, Any] = {f"v_{column}": values[column] for column in columns}
        states = list(expect_states)
        params["b_from"] = states[0] if len(states) == 1 else states
        move = _attempts_move(columns, len(states) == 1)
        with self._begin() as conn:
            return {row[0] for row in move.run(conn, list(attempt_ids), params)}

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
        return attempt_from_row(row), row.current_epoch

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
        return attempt_from_row(row)

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
