"""Where a job would run and why, without creating anything (`gpulayer plan`). Pure.

The target decision is submit's own (:func:`gpulayer.control.targets.choose_target`); this adds
what stands behind it: per worker target, the workers that could run the job ranked as the
scheduler ranks them and how many were turned down per reason; per cloud target, what the
cloud side says (see :mod:`gpulayer.cloud.offer_plan`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from gpulayer.control.targets import TARGET_WORKER_KIND, TargetDecision, WorkerView
from gpulayer.scheduler import WorkerSnapshot, explain, rank
from gpulayer.spec import JobSpec

CloudPlan = Callable[[JobSpec], dict[str, Any]]


def worker_plan(spec: JobSpec, workers: Sequence[WorkerSnapshot]) -> dict[str, Any]:
    """The workers that could ever run the job, best first (those free now before those busy
    now, each group in the order the job's strategy ranks them), and the number of workers
    turned down per reason."""
    explanation = explain(spec, workers)
    could = [w for w in workers if not explanation.never[w.id]]
    free = rank(spec, [w for w in could if not explanation.now[w.id]])
    busy = rank(spec, [w for w in could if explanation.now[w.id]])
    rows = [
        {
            "rank": position,
            "worker_id": worker.id,
            "name": worker.name,
            "fits_now": not explanation.now[worker.id],
            "waits_for": list(explanation.now[worker.id]),
        }
        for position, worker in enumerate([*free, *busy], start=1)
    ]
    rejected = Counter(
        reason for w in workers if explanation.never[w.id] for reason in explanation.never[w.id]
    )
    return {
        "workers": rows,
        "registered": len(workers),
        "rejected": dict(sorted(rejected.items(), key=lambda item: (-item[1], item[0]))),
    }


def _outcome(target: str, role: str, decision: TargetDecision, last: bool) -> tuple[str, str]:
    """(chosen | waits | skipped | unschedulable, the reason from the decision's notes)."""
    if decision.target == target:
        waiting = [n.removeprefix("waiting: ") for n in decision.notes if n.startswith("waiting: ")]
        if waiting:
            return "waits", "; ".join(waiting)
        return "chosen", ""
    skipped = f"{role} {target} skipped: "
    for note in decision.notes:
        if note.startswith(skipped):
            return "skipped", note.removeprefix(skipped).rsplit("; trying ", 1)[0]
    if last:
        return "unschedulable", decision.message or ""
    return "skipped", ""


def plan_job(
    spec: JobSpec,
    workers: Sequence[WorkerView],
    decision: TargetDecision,
    cloud: CloudPlan | None,
) -> dict[str, Any]:
    """Every target the job's chain tries, in order, up to the one it would take: its outcome,
    why, and what stands behind it. ``cloud`` None: no cloud provider is enabled."""
    chain = spec.placement.targets
    tried = []
    for position, target in enumerate(chain):
        role = "target" if position == 0 else "fallback"
        outcome, why = _outcome(target, role, decision, position == len(chain) - 1)
        entry: dict[str, Any] = {"target": target, "role": role, "outcome": outcome, "why": why}
        if target == "cloud":
            entry["cloud"] = cloud(spec) if cloud is not None else None
        else:
            kind = TARGET_WORKER_KIND[target]
            entry.update(worker_plan(spec, [w.snapshot for w in workers if w.kind == kind]))
        tried.append(entry)
        if outcome in ("chosen", "waits"):
            break
    plan: dict[str, Any] = {
        "target": decision.target,
        "message": decision.message,
        "tried": tried,
        "timeout_seconds": spec.timeout_seconds,
    }
    plan["headline"] = headline(plan)
    return plan


def headline(plan: dict[str, Any]) -> str:
    """The answer first, in one line: where the job would run (or why it would not)."""
    target = plan["target"]
    if target is None:
        return f"plan: the job would be refused: {plan.get('message') or 'nothing can run it'}"
    last = plan["tried"][-1]
    if last["outcome"] == "waits":
        return f"plan: the job would wait on {target}: {last['why']}"
    if target == "cloud":
        offers = (last.get("cloud") or {}).get("offers") or []
        if offers:
            return f"plan: the job would run on cloud, first trying {offers[0]['label']}"
        return "plan: the job would go to cloud"
    workers = [w for w in last.get("workers", []) if w["fits_now"]]
    if workers:
        return f"plan: the job would run on {target} worker {worker_name(workers[0])}"
    return f"plan: the job would queue on {target} until a worker is free"


def worker_name(row: dict[str, Any]) -> str:
    return f"{row['worker_id']} ({row['name']})" if row.get("name") else str(row["worker_id"])
