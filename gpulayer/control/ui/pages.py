"""What each dashboard page shows, gathered from the store into plain dicts for the templates.

The same context renders a whole page and, for live updates, just its changing part.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from gpulayer.control.job_filters import (
    JOB_STATES,
    check_states,
    parse_label_pairs,
    with_schedule,
)
from gpulayer.control.schedule_service import ScheduleService
from gpulayer.control.service import ControlService
from gpulayer.control.store import InstanceRecord
from gpulayer.control.ui.charts import Interval, daily_bars_svg, daily_totals, timeline_svg
from gpulayer.control.ui.timeline import cloud_phases, job_segments
from gpulayer.control.views import idle_left, job_view, state_label
from gpulayer.errors import UsageError
from gpulayer.protocol.messages import SETUP_LOG_PREFIX

PAGE_SIZE = 50


def _costs(instances: list[InstanceRecord], now: float) -> dict[str, dict[str, float]]:
    per_job: dict[str, dict[str, float]] = defaultdict(dict)
    for instance in instances:
        cost = instance.cost(now)
        if cost is not None:
            totals = per_job[instance.job_id]
            totals[instance.currency] = totals.get(instance.currency, 0.0) + cost
    return per_job


def parse_job_filters(query: Mapping[str, str]) -> dict[str, Any]:
    """The jobs page's filters from its query string; a bad one is a UsageError naming it."""
    state = (query.get("state") or "").strip()
    if state:
        check_states([state], "state")
    pairs = filter(None, (p.strip() for p in (query.get("label") or "").split(",")))
    labels = parse_label_pairs(pairs, "label")
    schedule = (query.get("schedule") or "").strip()
    labels = with_schedule(labels, schedule or None, "schedule")
    raw_page = (query.get("page") or "1").strip()
    if not raw_page.isdigit() or int(raw_page) < 1:
        raise UsageError("page: a whole number, 1 or more")
    return {
        "state": state,
        "label": (query.get("label") or "").strip(),
        "schedule": schedule,
        "labels": labels,
        "page": int(raw_page),
    }


def jobs_context(service: ControlService, filters: dict[str, Any]) -> dict[str, Any]:
    now = time.time()
    store = service.store
    jobs, total = store.jobs_page(
        states=[filters["state"]] if filters["state"] else None,
        labels=filters["labels"],
        offset=(filters["page"] - 1) * PAGE_SIZE,
        limit=PAGE_SIZE,
    )
    ids = [j.id for j in jobs]
    workers = {w.id: w.name for w in store.list_workers()}
    where: dict[str, str] = {}
    for attempt in store.attempts_for_jobs(ids):
        if attempt.worker_id:
            where[attempt.job_id] = workers.get(attempt.worker_id, attempt.worker_id)
    instances = store.instances_for_jobs(ids)
    for instance in instances:
        place = instance.instance_type or instance.provider
        zone = instance.zone or instance.region or instance.provider
        where[instance.job_id] = f"{place} ({zone})"
    costs = _costs(instances, now)
    rows = [
        {
            "id": job.id,
            "name": job.name,
            "state": job.state,
            "reason": job.reason or "",
            "target": job.target,
            "where": where.get(job.id, ""),
            "cost": costs.get(job.id, {}),
            "age": now - job.created_at,
            "labels": job.labels,
        }
        for job in jobs
    ]
    pages = max(1, math.ceil(total / PAGE_SIZE))
    return {"rows": rows, "total": total, "pages": pages, "filters": filters, "states": JOB_STATES}


def job_context(service: ControlService, job_ref: str) -> dict[str, Any]:
    now = time.time()
    store = service.store
    job_id = service.jobs.resolve_job_id(job_ref)
    job = store.get_job(job_id)
    attempts = store.attempts_for(job_id)
    workers = {w.id: w for w in store.list_workers()}
    instances = store.list_instances(job_id=job_id)
    view = job_view(job, attempts, workers)
    return {
        "job": view,
        "terminal": job.terminal,
        "spec_text": json.dumps(job.spec, indent=2, sort_keys=True),
        "timeline": timeline_svg(
            job_segments(job, attempts, instances, now, store.setup_spans(job_id, SETUP_LOG_PREFIX))
        ),
        "instances": [
            {
                "record": i,
                "phases": cloud_phases(i, now, store.instance_history(i.request_id)),
                "cost": i.cost(now),
            }
            for i in instances
        ],
        "cost": _costs(instances, now).get(job_id, {}),
        "artifacts": store.list_artifacts(job_id) if job.terminal else [],
        "waiting_for": service.jobs.waiting_reasons(job) if job.state == "queued" else [],
    }


def workers_context(service: ControlService) -> dict[str, Any]:
    now = time.time()
    rows = []
    for view in service.workers.worker_views():
        snapshot = view.snapshot
        caps = snapshot.capabilities
        gpus: dict[str, int] = defaultdict(int)
        for gpu in caps.gpus:
            size = f" {gpu.memory_gb:g}GB" if gpu.memory_gb else ""
            gpus[f"{gpu.name}{size}"] += 1
        record = service.store.get_worker(snapshot.id)
        rows.append(
            {
                "id": snapshot.id,
                "name": snapshot.name,
                "kind": view.kind,
                "state": snapshot.state,
                "gpus": ", ".join(f"{n}x {name}" for name, n in gpus.items()) or "none",
                "cpu": caps.cpu_cores,
                "memory_gb": caps.memory_gb,
                "accelerator": caps.accelerator,
                "running": snapshot.running,
                "gpus_busy": len(caps.gpus) - len(snapshot.free_gpus),
                "gpus_total": len(caps.gpus),
                "labels": snapshot.labels,
                "heartbeat_age": now - record.last_heartbeat,
                "isolation": caps.isolation,
            }
        )
    return {"rows": rows}


def gpu_hours_chart(service: ControlService) -> Any:
    now = time.time()
    today = datetime.fromtimestamp(now, tz=timezone.utc).date()
    intervals = [
        Interval(
            "GPU-hours",
            a.started_at or a.created_at,
            a.finished_at or now,
            float(len(a.gpu_indices)),
        )
        for a in service.store.attempts_since(now - 31 * 86400)
    ]
    axis, series = daily_totals(intervals, today=today)
    return daily_bars_svg(axis, series, title="GPU-hours per day, last 30 days", unit="GPU-h")


def instances_context(service: ControlService) -> dict[str, Any]:
    now = time.time()
    rows = []
    listed = service.store.list_instances()
    limits = service.cloud.idle_limits([i for i in listed if not i.gone])
    for instance in reversed(listed):
        since = instance.state_since
        if since is None:  # a record from before the lifecycle, which kept state_since
            marks = (instance.launched_at, instance.ready_at, instance.ended_at)
            since = max([instance.created_at, *(m for m in marks if m is not None)])
        idle = limits.get(instance.request_id, 0.0)
        left = idle_left(instance, idle, now)
        rows.append(
            {
                "record": instance,
                "state_label": state_label(instance.state, left, kept=idle is None),
                "age_in_state": now - since,
                "age": now - instance.created_at,
                "cost": instance.cost(now),
            }
        )
    return {"rows": rows}


def spend_chart(service: ControlService) -> Any:
    now = time.time()
    today = datetime.fromtimestamp(now, tz=timezone.utc).date()
    intervals = [
        Interval(i.provider, i.launched_at, i.ended_at or now, i.hourly_price)
        for i in service.store.list_instances()
        if i.launched_at is not None and i.hourly_price
    ]
    axis, series = daily_totals(intervals, today=today)
    return daily_bars_svg(axis, series, title="Spend per day by provider, last 30 days", unit="USD")


def offers_spec(query: Mapping[str, str]) -> dict[str, Any]:
    """The JobSpec `gpulayer offers` would build from the same filters."""
    resources: dict[str, Any] = {}
    placement: dict[str, Any] = {}
    gpu_models = [g.strip() for g in (query.get("gpu") or "").split(",") if g.strip()]
    if gpu_models:
        resources["gpu_models"] = gpu_models
        resources["accelerator"] = "cuda"
    gpus = (query.get("gpus") or "").strip()
    if gpus:
        if not gpus.isdigit():
            raise UsageError("gpus: a whole number")
        resources["gpu_count"] = int(gpus)
        resources.setdefault("accelerator", "cuda")
    accelerator = (query.get("accelerator") or "").strip()
    if accelerator:
        resources["accelerator"] = accelerator
    price = (query.get("max_hourly_cost") or "").strip()
    if price:
        try:
            placement["max_hourly_cost"] = float(price)
        except ValueError:
            raise UsageError("max_hourly_cost: a number") from None
    for field in ("provider", "region"):
        values = [v.strip() for v in (query.get(field) or "").split(",") if v.strip()]
        if values:
            placement[f"{field}s"] = values
    spec: dict[str, Any] = {"workload": {"kind": "command", "command": ["true"]}}
    if resources:
        spec["resources"] = resources
    if placement:
        spec["placement"] = placement
    return spec


def offers_context(service: ControlService, query: Mapping[str, str]) -> dict[str, Any]:
    from gpulayer.cloud.search import list_offers
    from gpulayer.spec.validate import validate_spec

    limit_text = (query.get("limit") or "30").strip()
    if not limit_text.isdigit():
        raise UsageError("limit: a whole number, 0 or more")
    spec = validate_spec(offers_spec(query))
    listing = list_offers(
        service.layout.root,
        spec,
        gpu_count_exact=bool((query.get("gpus") or "").strip()),
        include_disabled=query.get("enabled_only") != "1",
        limit=int(limit_text),
        # The form's own field names, as its error line shows them.
        names={"gpu_models": "gpu", "regions": "region", "providers": "provider"},
    )
    return {"listing": listing, "query": dict(query)}


PLAN_SPEC_LIMIT = 256 * 1024
"""The most a pasted spec may hold (characters): a spec is a page of text, not a data file."""


def plan_context(service: ControlService, text: str) -> dict[str, Any]:
    """Where a pasted job spec (YAML or JSON) would run and why, as `gpulayer plan` says it;
    nothing is created."""
    from gpulayer.spec.loader import parse_spec_text
    from gpulayer.spec.submit_arch import machine_arch, with_submit_arch

    if not text.strip():
        raise UsageError("spec: paste a job spec (YAML or JSON) to plan")
    if len(text) > PLAN_SPEC_LIMIT:
        raise UsageError(f"spec: longer than {PLAN_SPEC_LIMIT} characters")
    try:
        data = parse_spec_text(text, yaml_first=not text.lstrip().startswith("{"))
    except UsageError as exc:
        # The loader names the CLI's flag; here the field is the form's.
        raise UsageError("spec: " + str(exc).removeprefix("--file: ")) from None
    return {"plan": service.submissions.plan(with_submit_arch(data, machine_arch()))}


def schedules_context(schedules: ScheduleService | None) -> dict[str, Any]:
    """Each schedule with its next ticks, its recent runs (state or skip reason) and budget."""
    if schedules is None:
        return {"rows": [], "supported": False}
    from gpulayer.control.schedule_views import schedule_detail

    return {
        "rows": [schedule_detail(schedules, loaded, runs=8) for loaded in schedules.all()],
        "supported": True,
    }
