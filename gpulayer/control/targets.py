"""Choosing a job's target at submit: the first in its chain that could ever run it.

A local target never waits for hardware that cannot appear; a remote target with nothing that
could ever run it moves on to the next target, and as the last target it queues or fails as
`on_unschedulable` says; a cloud target needs a provider.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpulayer.scheduler import WorkerSnapshot, never_reasons, node_count
from gpulayer.spec import JobSpec

TARGET_WORKER_KIND = {"local": "local", "remote": "remote", "cloud": "cloud"}


@dataclass
class TargetDecision:
    target: str | None
    """None: no target can take the job; it fails as unschedulable."""
    message: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class WorkerView:
    kind: str
    snapshot: WorkerSnapshot


def _why_not(spec: JobSpec, workers: Sequence[WorkerView], target: str) -> list[str] | None:
    """None if enough workers of the target could ever run the job (N distinct ones for a gang
    of N nodes), else the reasons per worker."""
    candidates = [w.snapshot for w in workers if w.kind == TARGET_WORKER_KIND[target]]
    labels = {w.id: "this machine" for w in candidates} if target == "local" else None
    reasons = never_reasons(spec, candidates, label=labels)
    if reasons is None:
        return None
    if not candidates:
        reasons.append(f"no {target} worker is registered")
    return reasons


def choose_target(
    spec: JobSpec,
    workers: Sequence[WorkerView],
    *,
    cloud_available: bool = False,
    cloud_refusal: Callable[[JobSpec], str | None] | None = None,
) -> TargetDecision:
    """``cloud_refusal`` says why no offer could ever take a gang (checked only for gangs,
    before anything is rented), or None."""
    chain = spec.placement.targets
    notes: list[str] = []
    for position, target in enumerate(chain):
        last = position == len(chain) - 1
        if target == "cloud":
            refusal = None
            if cloud_available and cloud_refusal is not None and node_count(spec) > 1:
                refusal = cloud_refusal(spec)
            if not cloud_available:
                reasons = ["no cloud provider is installed or enabled"]
            elif refusal is not None:
                reasons = [refusal]
            else:
                return TargetDecision("cloud", notes=notes)
        else:
            found = _why_not(spec, workers, target)
            if found is None:
                return TargetDecision(target, notes=notes)
            reasons = found
            if target == "remote" and last and spec.placement.on_unschedulable == "queue":
                notes.extend(f"waiting: {r}" for r in reasons)
                return TargetDecision("remote", notes=notes)
        summary = "; ".join(reasons)
        if not last:
            notes.append(
                f"target {target} cannot run this job ({summary}); trying {chain[position + 1]}"
            )
            continue
        notes.append(f"unschedulable: {summary}")
        return TargetDecision(None, message=summary, notes=notes)
    raise AssertionError("a placement chain is never empty")
