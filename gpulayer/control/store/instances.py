"""Rented instances and their reservations: the cost ledger and the lifecycle's records
(the lifecycle's InstanceStore port)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    and_,
    func,
    insert,
    or_,
    select,
    update,
)

from gpulayer.cloud.lifecycle.records import INSTANCE_GONE_STATES, InstanceRecord
from gpulayer.cloud.lifecycle.states import check_transition
from gpulayer.control import tables as t
from gpulayer.control.record_states import RESERVATION_TRANSITIONS, sources
from gpulayer.control.store.engine import StoreBase
from gpulayer.control.store.records import (
    ReservationRecord,
    TransitionRecord,
    encode_instance_json,
    in_chunks,
    instance_from_row,
)
from gpulayer.errors import NotFoundError


class _NotIdle(Exception):
    """An idle instance's reservation was not idle: the take is undone."""


class InstanceLedger(StoreBase):
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
                values["job_id"] = values.get("job_id") or None  # a fleet's: no job yet
                encode_instance_json(values)
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
        encode_instance_json(values)
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

    def reservations_of(self, request_ids: Sequence[str]) -> list[ReservationRecord]:
        """The reservations of these instances, released ones included."""
        found: list[ReservationRecord] = []
        with self.engine.connect() as conn:
            for chunk in in_chunks(list(request_ids)):
                query = select(t.reservations).where(t.reservations.c.request_id.in_(chunk))
                found.extend(ReservationRecord(**r._mapping) for r in conn.execute(query))
        return found

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
                # Only a job taking an idle machine binds an idle reservation (see
                # take_idle_instance): a worker registering again leaves it idle.
                t.reservations.c.state == "pending",
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

    def rest_reservation(self, request_id: str) -> bool:
        """The job is done with the instance's worker, which is kept for the next job: True
        when its bound reservation is idle now."""
        condition = and_(
            t.reservations.c.request_id == request_id,
            t.reservations.c.state.in_(sources(RESERVATION_TRANSITIONS, "idle")),
        )
        with self._begin() as conn:
            return bool(
                conn.execute(update(t.reservations).where(condition).values(state="idle")).rowcount
                == 1
            )

    def take_idle_instance(self, request_id: str, job_id: str, *, reason: str) -> bool:
        """``job_id`` takes the idle instance and its worker, in one transaction: the instance
        moves idle -> ready as the job's record (its cost goes on accruing there) and its
        reservation is bound to the job. False when it is not idle any more (another job took
        it, or it began to drain)."""
        return self.take_idle_instances([request_id], job_id, reason=reason)

    def take_idle_instances(self, request_ids: Sequence[str], job_id: str, *, reason: str) -> bool:
        """:meth:`take_idle_instance` of several machines at once, all or none: a gang's
        nodes (node rank in the given order, launch id the first's). False, and nothing
        taken, when any of them is not idle any more."""
        now = time.time()
        gang = len(request_ids) > 1
        try:
            with self._begin() as conn:
                for rank, request_id in enumerate(request_ids):
                    placed = {"launch_id": request_ids[0] if gang else None, "node_rank": rank}
                    self._take_idle(conn, request_id, job_id, reason, now, placed)
        except _NotIdle:  # every move is rolled back with the transaction
            return False
        return True

    def _take_idle(
        self,
        conn: Any,
        request_id: str,
        job_id: str,
        reason: str,
        now: float,
        placed: dict[str, Any],
    ) -> None:
        # Both moves are the tables' own: idle -> ready, and a reservation idle -> bound.
        check_transition("idle", "ready")
        if "idle" not in sources(RESERVATION_TRANSITIONS, "bound"):
            raise _NotIdle(request_id)
        row = conn.execute(
            select(t.instances).where(
                and_(t.instances.c.request_id == request_id, t.instances.c.state == "idle")
            )
        ).first()
        if row is None:
            raise _NotIdle(request_id)
        # The ledger keeps each job's share: the job that held it keeps an entry of its own,
        # from the launch to now; the machine's record is the taker's from now on.
        moved = conn.execute(
            update(t.instances)
            .where(and_(t.instances.c.request_id == request_id, t.instances.c.state == "idle"))
            .values(state="ready", state_since=now, job_id=job_id, launched_at=now, **placed)
        ).rowcount
        if moved != 1:
            raise _NotIdle(request_id)
        self._hand_over_entry(conn, dict(row._mapping), job_id, now)
        bound = conn.execute(
            update(t.reservations)
            .where(
                and_(
                    t.reservations.c.request_id == request_id,
                    t.reservations.c.state == "idle",
                )
            )
            .values(state="bound", job_id=job_id, bound_at=now)
        ).rowcount
        if bound != 1:
            raise _NotIdle(request_id)
        conn.execute(
            insert(t.instance_transitions).values(
                request_id=request_id,
                from_state="idle",
                to_state="ready",
                reason=reason,
                at=now,
            )
        )

    @staticmethod
    def _hand_over_entry(conn: Any, held: dict[str, Any], taker: str, now: float) -> None:
        """The ledger entry of the job a warm machine was taken from: the machine's price from
        its (last) launch to ``now``, under a request id of its own, in a final state."""
        from gpulayer.ids import new_id

        why = f"taken by job {taker}; the machine went on as instance {held['request_id']}"
        entry = {
            **held,
            "request_id": new_id("r", 12),
            "state": "handed_over",
            "state_since": now,
            "ended_at": now,
            "note": why,
            # Nothing of the machine is this entry's to end: no key, token, tunnel or link.
            "key_path": None,
            "token_hash": None,
            "tunnel_port": None,
            "install_dir": None,
            "launch_id": None,
        }
        conn.execute(insert(t.instances).values(**entry))
        conn.execute(
            insert(t.instance_transitions).values(
                request_id=entry["request_id"],
                from_state=None,
                to_state="handed_over",
                reason=why,
                at=now,
            )
        )

    def update_instance(self, request_id: str, **values: Any) -> None:
        if "tags" in values:
            values["tags"] = json.dumps(values["tags"])
        encode_instance_json(values)
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
        return instance_from_row(row)

    def list_instances(
        self, *, job_id: str | None = None, live_only: bool = False
    ) -> list[InstanceRecord]:
        query = select(t.instances).order_by(t.instances.c.created_at)
        if job_id is not None:
            query = query.where(t.instances.c.job_id == job_id)
        if live_only:
            query = query.where(t.instances.c.state.not_in(list(INSTANCE_GONE_STATES)))
        with self.engine.connect() as conn:
            return [instance_from_row(r) for r in conn.execute(query)]

    def instances_holding_offers(self, now: float) -> list[InstanceRecord]:
        """Tries whose offer is held for every job until a time still to come."""
        query = select(t.instances).where(t.instances.c.hold_until > now)
        with self.engine.connect() as conn:
            return [instance_from_row(r) for r in conn.execute(query)]

    def capacity_freed_at(self) -> float:
        """When a machine a provider had last ended (0: never): capacity refusals from before
        then are looked at again."""
        query = select(func.max(t.instances.c.ended_at)).where(
            and_(t.instances.c.state == "terminated", t.instances.c.instance_id.is_not(None))
        )
        with self.engine.connect() as conn:
            return float(conn.execute(query).scalar() or 0.0)

    def clear_step_retries(self) -> None:
        """Every failed step is tried again at the next pass (``gpulayer cloud reap``)."""
        live = t.instances.c.state.not_in(list(INSTANCE_GONE_STATES))
        with self._begin() as conn:
            conn.execute(
                update(t.instances)
                .where(and_(live, t.instances.c.next_step_at.is_not(None)))
                .values(next_step_at=None)
            )
