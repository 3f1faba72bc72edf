"""Persistence for jobs, attempts, logs, workers, tokens, instances and schedules
(SQLAlchemy Core), one module per aggregate over one engine and one schema.

SQLite by default (WAL, so readers never block the writer and several gpulayer processes can
share one file), PostgreSQL by URL.
"""

from __future__ import annotations

from gpulayer.cloud.lifecycle.records import InstanceRecord
from gpulayer.control.store.attempt_ends import (
    AttemptEnd,
    AttemptEndStore,
    EndRecorded,
    EndRule,
)
from gpulayer.control.store.dashboard import DashboardStore
from gpulayer.control.store.engine import POOL_OVERFLOW, POOL_SIZE, create_store_engine
from gpulayer.control.store.instances import InstanceLedger
from gpulayer.control.store.jobs import JobStore, job_row
from gpulayer.control.store.leases import LeaseStore
from gpulayer.control.store.once_keys import OnceKeyStore
from gpulayer.control.store.records import (  # noqa: F401 (the store's records)
    IDS_PER_QUERY,
    LIVE_STATES,
    TERMINAL_STATES,
    AttemptRecord,
    JobRecord,
    LogLine,
    QueuedHead,
    ReservationRecord,
    ScheduleRecord,
    ScheduleRunRecord,
    StoreError,
    TokenRecord,
    TransitionRecord,
    WorkerRecord,
    attempt_from_row,
    encode_instance_json,
    in_chunks,
    instance_from_row,
    job_from_row,
    schedule_from_row,
    schedule_run_from_row,
    stored_json,
    token_from_row,
    worker_from_row,
)
from gpulayer.control.store.schedules import ScheduleStore
from gpulayer.control.store.secrets import SecretRows
from gpulayer.control.store.tokens import TokenStore
from gpulayer.control.store.workers import WorkerStore
from gpulayer.errors import NotFoundError


class Store(
    JobStore,
    AttemptEndStore,
    WorkerStore,
    TokenStore,
    InstanceLedger,
    LeaseStore,
    ScheduleStore,
    DashboardStore,
    OnceKeyStore,
    SecretRows,
):
    """The control plane's database: every aggregate's reads and writes, sharing one engine
    (and, on SQLite, one writer at a time)."""


__all__ = [
    "POOL_OVERFLOW",
    "POOL_SIZE",
    "AttemptEnd",
    "EndRecorded",
    "EndRule",
    "InstanceRecord",
    "NotFoundError",
    "Store",
    "create_store_engine",
    "job_row",
]
