"""Many attempts ending in one write transaction: what a worker's batched finish report
records, where one attempt at a time took three transactions (its logs, its move, its job's)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Column, Update, and_, bindparam, select, update

from gpulayer.control import tables as t
from gpulayer.control.store.by_ids import by_ids
from gpulayer.control.store.logs import LogStore
from gpulayer.control.store.records import AttemptRecord, attempt_from_row, in_chunks


@dataclass(frozen=True)
class AttemptEnd:
    """One attempt of a job of one node ending, as its worker reported it."""

    attempt_id: int
    job_id: str
    number: int
    state: str
    reason: str | None = None
    exit_code: int | None = None
    result: Any = None
    message: str | None = None
    keep_message: bool = False
    """Leave the job's message as it is (a success reported without a word)."""
    logs: Sequence[tuple[str, str]] = field(default_factory=tuple)


@dataclass(frozen=True)
class EndRule:
    """Where the state tables let an end of one state move things from."""

    attempt_from: Sequence[str]
    job_from: Sequence[str]
    others_to: str
    """The state the job's other live attempts end in."""
    others_from: Sequence[str]


@dataclass(frozen=True)
class EndRecorded:
    attempt_moved: bool
    """False: the attempt was no longer live (fenced, cancelled, ended by another report)."""
    job_moved: bool
    """False: the job had left ``running`` by another path (a cancel, another plane)."""


_NOT_MOVED = EndRecorded(attempt_moved=False, job_moved=False)

_BOUND_AS = {
    "reason": "b_reason",
    "exit_code": "b_exit",
    "result": "b_result",
    "message": "b_message",
    "finished_at": "b_now",
}


@dataclass(frozen=True)
class _Move:
    """A conditional move in its two shapes: from one state (``=``), or from any of several
    (an expanding IN, rendered anew on every run: most moves come from one state)."""

    one: Update
    many: Update

    def run(self, conn: Any, states: Sequence[str], params: dict[str, Any]) -> Any:
        if len(states) == 1:
            return conn.execute(self.one, {**params, "b_from": states[0]})
        return conn.execute(self.many, {**params, "b_from": list(states)})


def _conditional_move(key: Column[Any], *columns: str) -> _Move:
    """Built once (statements built per report cost more than running them): the rows whose
    ``key`` is ``b_key`` move to ``b_state`` only from the states in ``b_from``, with the named
    columns bound too."""
    table = key.table
    bound: dict[str, Any] = {column: bindparam(_BOUND_AS[column]) for column in columns}

    def move(from_: Any) -> Update:
        where = and_(key == bindparam("b_key"), from_)
        return update(table).where(where).values(state=bindparam("b_state"), **bound)

    state = table.c.state
    return _Move(
        one=move(state == bindparam("b_from")),
        many=move(state.in_(bindparam("b_from", expanding=True))),
    )


_MOVE_ATTEMPT = _conditional_move(t.attempts.c.id, "reason", "exit_code", "finished_at")
_END_OTHER_ATTEMPTS = _conditional_move(t.attempts.c.job_id, "reason", "finished_at")
_END_JOB_KEEPING_MESSAGE = _conditional_move(
    t.jobs.c.id, "reason", "exit_code", "result", "finished_at"
)
_END_JOB = _conditional_move(t.jobs.c.id, "reason", "exit_code", "result", "message", "finished_at")
_ATTEMPTS_WITH_EPOCHS = by_ids(
    t.attempts.c.id,
    lambda ids: (
        select(t.attempts, t.workers.c.epoch.label("current_epoch"))
        .select_from(t.attempts.outerjoin(t.workers, t.workers.c.id == t.attempts.c.worker_id))
        .where(ids)
    ),
)


class AttemptEndStore(LogStore):
    def attempts_and_epochs(
        self, attempt_ids: Sequence[int]
    ) -> dict[int, tuple[AttemptRecord, int | None]]:
        """attempt_and_epoch for several attempts in one query; missing ids are left out."""
        found: dict[int, tuple[AttemptRecord, int | None]] = {}
        with self.engine.connect() as conn:
            for chunk in in_chunks(list(attempt_ids)):
                for row in _ATTEMPTS_WITH_EPOCHS.run(conn, chunk):
                    found[row.id] = (attempt_from_row(row), row.current_epoch)
        return found

    def end_attempts(
        self,
        ends: Sequence[AttemptEnd],
        rules: Mapping[str, EndRule],
    ) -> list[EndRecorded]:
        """Each end, all in one write transaction, by the rule of its state: the attempt
        moves only from where the rule allows; only if it moved are its log lines kept and its
        job moved to the same state (only from where the rule allows); a job that moved takes
        its other live attempts along. What each end did, in order."""
        now = time.time()
        recorded = [_NOT_MOVED] * len(ends)
        with self._begin() as conn:
            # In job id order, as assign_all: two servers on one PostgreSQL lock rows alike.
            # The same attempt twice in one report moves once: the second finds it ended.
            for at in sorted(range(len(ends)), key=lambda i: (ends[i].job_id, i)):
                end = ends[at]
                rule = rules[end.state]
                moved = _MOVE_ATTEMPT.run(
                    conn,
                    rule.attempt_from,
                    {
                        "b_key": end.attempt_id,
                        "b_state": end.state,
                        "b_reason": end.reason,
                        "b_exit": end.exit_code,
                        "b_now": now,
                    },
                ).rowcount
                if moved != 1:
                    continue
                if end.logs:
                    self._append_logs_in(conn, end.job_id, end.number, end.logs, node=None, now=now)
                job_moved = self._end_job_in(conn, end, rule.job_from, now)
                if job_moved:
                    _END_OTHER_ATTEMPTS.run(
                        conn,
                        rule.others_from,
                        {
                            "b_key": end.job_id,
                            "b_state": rule.others_to,
                            "b_reason": end.reason or "job_ended",
                            "b_now": now,
                        },
                    )
                recorded[at] = EndRecorded(True, job_moved)
        return recorded

    @staticmethod
    def _end_job_in(conn: Any, end: AttemptEnd, job_from: Sequence[str], now: float) -> bool:
        moved = (_END_JOB_KEEPING_MESSAGE if end.keep_message else _END_JOB).run(
            conn,
            job_from,
            {
                "b_key": end.job_id,
                "b_state": end.state,
                "b_reason": end.reason,
                "b_exit": end.exit_code,
                "b_result": None if end.result is None else json.dumps(end.result),
                "b_message": end.message,
                "b_now": now,
            },
        )
        return bool(moved.rowcount == 1)
