"""The store's records: what a row of each table reads as, and the conversions."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpulayer.cloud.lifecycle.records import InstanceRecord
from gpulayer.errors import GpulayerError

TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
LIVE_STATES = frozenset({"queued", "provisioning", "running"})


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
    # The kept bundle the job runs, by digest (schema 10); None with has_bundle: a bundle file
    # in the job's folder, as older schemas kept it.
    bundle_digest: str | None = None

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
        # Written so that an expiry no number can compare with (NaN) refuses the token.
        if self.expires_at is not None and not now < self.expires_at:
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


def stored_json(text: str | None, default: Any) -> Any:
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


def job_from_row(row: Any) -> JobRecord:
    m = row._mapping
    return JobRecord(
        id=m["id"],
        name=m["name"],
        spec=stored_json(m["spec"], {}),
        state=m["state"],
        reason=m["reason"],
        message=m["message"],
        exit_code=m["exit_code"],
        result=stored_json(m["result"], None),
        target=m["target"],
        working_dir=m["working_dir"],
        has_bundle=bool(m["has_bundle"]),
        attempts=m["attempts"],
        cancel_requested=bool(m["cancel_requested"]),
        created_at=m["created_at"],
        started_at=m["started_at"],
        finished_at=m["finished_at"],
        labels=stored_json(m["labels"], {}),
        bundle_digest=m["bundle_digest"],
    )


def attempt_from_row(row: Any) -> AttemptRecord:
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


def worker_from_row(row: Any) -> WorkerRecord:
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


def encode_instance_json(values: dict[str, Any]) -> None:
    for name in ("offer", "machine"):
        if values.get(name) is not None:
            values[name] = json.dumps(values[name])


IDS_PER_QUERY = 500
"""Ids per IN (...) list: well under any database's limit on bound parameters."""


_Id = TypeVar("_Id", str, int)


def in_chunks(ids: Sequence[_Id]) -> Iterator[list[_Id]]:
    for start in range(0, len(ids), IDS_PER_QUERY):
        yield list(ids[start : start + IDS_PER_QUERY])


def token_from_row(row: Any) -> TokenRecord:
    m = row._mapping
    return TokenRecord(**{f: m[f] for f in TokenRecord.__dataclass_fields__})


def instance_from_row(row: Any) -> InstanceRecord:
    m = dict(row._mapping)
    m["step_failures"] = m.get("step_failures") or 0
    m["tags"] = json.loads(m["tags"] or "{}")
    m["offer"] = json.loads(m["offer"]) if m.get("offer") else None
    m["machine"] = json.loads(m["machine"]) if m.get("machine") else None
    m["spot"] = bool(m["spot"])
    m["job_id"] = m["job_id"] or ""  # NULL: a fleet's machine no job has taken yet
    return InstanceRecord(**m)


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


def schedule_from_row(row: Any) -> ScheduleRecord:
    m = dict(row._mapping)
    m["spec"] = json.loads(m["spec"])
    m["suspend"] = bool(m["suspend"])
    m["has_bundle"] = bool(m["has_bundle"])
    return ScheduleRecord(**m)


def schedule_run_from_row(row: Any) -> ScheduleRunRecord:
    m = dict(row._mapping)
    m["manual"] = bool(m["manual"])
    return ScheduleRunRecord(**m)
