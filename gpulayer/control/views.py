"""The JSON shapes the API returns (and `--json` prints)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from gpulayer.control.gangs import gang_size
from gpulayer.control.store import (
    AttemptRecord,
    InstanceRecord,
    JobRecord,
    LogLine,
    TokenRecord,
    TransitionRecord,
    WorkerRecord,
)

# The dates a timestamp may show: a row stored before its numbers were bounded may hold any
# float, and one unprintable date must not fail the listing that holds it.
_EARLIEST = datetime(1, 1, 2, tzinfo=timezone.utc).timestamp()
_LATEST = datetime(9999, 12, 30, tzinfo=timezone.utc).timestamp()


def iso(ts: float | None) -> str | None:
    if ts is None or ts != ts:  # NaN says no time at all
        return None
    clamped = min(max(float(ts), _EARLIEST), _LATEST)
    return datetime.fromtimestamp(clamped, tz=timezone.utc).isoformat(timespec="milliseconds")


def job_view(
    job: JobRecord,
    attempts: list[AttemptRecord] | None = None,
    workers: dict[str, WorkerRecord] | None = None,
) -> dict[str, Any]:
    view: dict[str, Any] = {
        "id": job.id,
        "name": job.name,
        "state": job.state,
        "reason": job.reason,
        "message": job.message,
        "exit_code": job.exit_code,
        "result": job.result,
        "target": job.target,
        "nodes": gang_size(job),
        "labels": job.labels,
        "created_at": iso(job.created_at),
        "started_at": iso(job.started_at),
        "finished_at": iso(job.finished_at),
        "cancel_requested": job.cancel_requested,
    }
    if attempts is not None:
        view["attempts"] = [
            attempt_view(a, (workers or {}).get(a.worker_id or "")) for a in attempts
        ]
    else:
        view["attempts"] = job.attempts
    return view


def attempt_view(attempt: AttemptRecord, worker: WorkerRecord | None) -> dict[str, Any]:
    return {
        "number": attempt.number,
        "node_rank": attempt.node_rank,
        "state": attempt.state,
        "reason": attempt.reason,
        "exit_code": attempt.exit_code,
        "worker_id": attempt.worker_id,
        "worker_name": worker.name if worker else None,
        "gpu_indices": attempt.gpu_indices,
        "started_at": iso(attempt.started_at),
        "finished_at": iso(attempt.finished_at),
    }


def worker_view(worker: WorkerRecord, *, running: int = 0) -> dict[str, Any]:
    return {
        "id": worker.id,
        "name": worker.name,
        "kind": worker.kind,
        "state": worker.state,
        "labels": worker.labels,
        "running": running,
        "capabilities": worker.capabilities,
        "degraded": worker.capabilities.get("degraded"),
        "registered_at": iso(worker.registered_at),
        "last_heartbeat": iso(worker.last_heartbeat),
    }


def log_view(line: LogLine) -> dict[str, Any]:
    view: dict[str, Any] = {
        "id": line.id,
        "attempt": line.attempt,
        "stream": line.stream,
        "text": line.text,
        "at": iso(line.at),
    }
    if line.node is not None:
        view["node"] = line.node
    return view


def instance_view(record: InstanceRecord, now: float) -> dict[str, Any]:
    return {
        "request_id": record.request_id,
        # None: a fleet's machine no job has taken yet.
        "job_id": record.job_id or None,
        "fleet": record.fleet,
        "provider": record.provider,
        "region": record.region,
        "zone": record.zone,
        "instance_type": record.instance_type,
        "instance_id": record.instance_id,
        "state": record.state,
        "spot": record.spot,
        "hourly_price": record.hourly_price,
        "currency": record.currency,
        "launched_at": iso(record.launched_at),
        "ready_at": iso(record.ready_at),
        "ended_at": iso(record.ended_at),
        "cost": record.cost(now),
        # The nodes of a gang share a launch id; a job's cost is the sum over its nodes.
        "launch_id": record.launch_id,
        "node_rank": record.node_rank,
    }


def idle_left(record: InstanceRecord, idle_seconds: float | None, now: float) -> float | None:
    """Seconds until an idle (warm) instance drains, read from its provider's (or its fleet's)
    idle_seconds as the lifecycle reads them; None when it is not idle, or is a fleet's
    machine kept within its min_nodes (``idle_seconds`` None)."""
    from gpulayer.cloud.lifecycle.states import idle_limit

    if record.state != "idle" or idle_seconds is None:
        return None
    limit = idle_limit(idle_seconds)
    since = record.state_since or record.created_at
    return None if limit is None else max(0.0, since + limit - now)


def state_label(state: str, left: float | None, *, kept: bool = False) -> str:
    """``idle (42 s left)`` for a warm machine, ``idle (kept: min_nodes)`` for a fleet's
    machine kept up; the state itself otherwise."""
    if kept and state == "idle":
        return f"{state} (kept: min_nodes)"
    return state if left is None else f"{state} ({left:.0f} s left)"


def lifecycle_view(
    record: InstanceRecord,
    history: list[TransitionRecord],
    now: float,
    idle_seconds: float | None = 0.0,
) -> dict[str, Any]:
    """One rented instance for `gpulayer instances` and `status`: where it is, since when, and
    the phases it went through."""
    from gpulayer.cloud.lifecycle.phases import phase_rows

    view = instance_view(record, now)
    since = record.state_since or record.created_at
    view["state_since"] = iso(since)
    view["age_in_state_seconds"] = round(max(0.0, now - since), 3)
    left = idle_left(record, idle_seconds, now)
    view["idle_seconds_left"] = None if left is None else round(left, 1)
    kept = record.state == "idle" and idle_seconds is None
    view["idle_kept"] = kept
    view["state_label"] = state_label(record.state, left, kept=kept)
    view["phases"] = [
        {**row, "started_at": iso(row["started_at"]), "ended_at": iso(row["ended_at"])}  # type: ignore[arg-type]
        for row in phase_rows(history, now)
    ]
    view["history"] = [
        {"from": h.from_state, "to": h.to_state, "reason": h.reason, "at": iso(h.at)}
        for h in history
    ]
    view["note"] = record.note
    view["outcome"] = record.outcome
    view["outcome_scope"] = record.outcome_scope
    view["outcome_message"] = record.outcome_message
    view["offer_held_until"] = iso(record.hold_until) if record.hold_until else None
    view["last_error"] = record.last_error
    view["last_step"] = last_step_view(record)
    return view


def last_step_view(record: InstanceRecord) -> dict[str, Any] | None:
    """What the instance's last lifecycle step found, as the store keeps it (None: no step
    has run, or its result is of a shape this version does not read)."""
    result = record.step_result
    if result is None:
        return None
    return {
        "step": result.step,
        "at": iso(result.at),
        "outcome": result.outcome,
        "note": result.note,
        "error": result.error.type if result.error is not None else None,
        "moved_to": result.move_to,
        "not_before": iso(result.not_before) if result.not_before is not None else None,
    }


def cost_view(records: list[InstanceRecord]) -> dict[str, Any]:
    """The ledger: each instance's times and price, accrued cost per job and in total."""
    import time

    now = time.time()
    instances = [instance_view(r, now) for r in records]
    totals: dict[str, float] = {}
    per_job: dict[str, dict[str, float]] = {}
    per_fleet: dict[str, dict[str, float]] = {}
    unpriced = 0
    for item in instances:
        if item["cost"] is None:
            unpriced += 1
            continue
        totals[item["currency"]] = totals.get(item["currency"], 0.0) + item["cost"]
        # A fleet machine's time that no job took is the fleet's.
        if item["job_id"] is not None:
            job = per_job.setdefault(item["job_id"], {})
            job[item["currency"]] = job.get(item["currency"], 0.0) + item["cost"]
        if item["fleet"] is not None and item["job_id"] is None:
            fleet = per_fleet.setdefault(item["fleet"], {})
            fleet[item["currency"]] = fleet.get(item["currency"], 0.0) + item["cost"]
    return {
        "instances": instances,
        "per_job": per_job,
        "per_fleet": per_fleet,
        "total": totals,
        "unpriced_instances": unpriced,
    }


def token_view(token: TokenRecord) -> dict[str, Any]:
    """A token's record for `gpulayer token ls`: never its hash, salt or digest."""
    import time

    return {
        "id": token.id,
        "kind": token.kind,
        "name": token.name,
        "created_at": iso(token.created_at),
        "expires_at": iso(token.expires_at),
        "max_workers": token.max_workers,
        "registered": token.registered,
        "worker_id": token.worker_id,
        "revoked_at": iso(token.revoked_at),
        "state": token.refused_because(time.time()) or "active",
    }
