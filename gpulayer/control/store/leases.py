"""The lifecycle's steps in flight and its jobs' waits for capacity, kept in the store (the
lifecycle's LeaseStore port), so a second controller or a restarted one sees them."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from sqlalchemy import and_, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from gpulayer.control import tables as t
from gpulayer.control.store.engine import StoreBase
from gpulayer.control.store.records import in_chunks


class LeaseStore(StoreBase):
    def take_lease(self, key: str, token: str, *, now: float, expires_at: float) -> bool:
        """Hold ``key`` under ``token`` until ``expires_at``: True unless another holder's
        lease on it is still unexpired."""
        leases = t.lifecycle_leases
        with self._begin() as conn:
            taken = conn.execute(
                update(leases)
                .where(and_(leases.c.key == key, leases.c.lock_expires_at <= now))
                .values(lock_token=token, lock_expires_at=expires_at)
            )
            if taken.rowcount:
                return True
        try:
            with self._begin() as conn:
                conn.execute(
                    insert(leases).values(key=key, lock_token=token, lock_expires_at=expires_at)
                )
        except IntegrityError:  # another holder has it
            return False
        return True

    def renew_leases(self, tokens: Collection[str], expires_at: float) -> None:
        leases = t.lifecycle_leases
        with self._begin() as conn:
            for chunk in in_chunks(sorted(tokens)):
                conn.execute(
                    update(leases)
                    .where(leases.c.lock_token.in_(chunk))
                    .values(lock_expires_at=expires_at)
                )

    def drop_leases(self, held: Iterable[tuple[str, str]]) -> None:
        """End the leases given as (key, token); one another holder took since is kept."""
        leases = t.lifecycle_leases
        pairs = list(held)
        if not pairs:
            return
        with self._begin() as conn:
            for key, token in pairs:
                conn.execute(
                    delete(leases).where(and_(leases.c.key == key, leases.c.lock_token == token))
                )

    def leased_keys(self, now: float) -> set[str]:
        """The keys whose step some controller runs now."""
        leases = t.lifecycle_leases
        query = select(leases.c.key).where(leases.c.lock_expires_at > now)
        with self.engine.connect() as conn:
            return set(conn.execute(query).scalars())

    # --- waits for capacity ------------------------------------------------------------------

    def capacity_waits(self) -> dict[str, float]:
        """Job id -> the time before which it is not planned again."""
        waits = t.capacity_waits
        with self.engine.connect() as conn:
            return {job_id: at for job_id, at in conn.execute(select(waits))}

    def wait_for_capacity_until(self, job_id: str, not_before: float) -> None:
        waits = t.capacity_waits
        with self._begin() as conn:
            changed = conn.execute(
                update(waits).where(waits.c.job_id == job_id).values(not_before=not_before)
            )
            if not changed.rowcount:
                conn.execute(insert(waits).values(job_id=job_id, not_before=not_before))

    def end_capacity_waits(self, job_ids: Collection[str] | None = None) -> None:
        """End the waits of ``job_ids`` (every wait when None): they are planned at once."""
        waits = t.capacity_waits
        with self._begin() as conn:
            if job_ids is None:
                conn.execute(delete(waits))
                return
            for chunk in in_chunks(sorted(job_ids)):
                conn.execute(delete(waits).where(waits.c.job_id.in_(chunk)))
