"""Choosing a job's target at submit: the first in its chain that could ever run it.

A local target never waits for hardware that cannot appear; a remote target with nothing that
could ever run it moves on to the next target, and as the last target it queues or fails as
`on_unschedulable` says; a cloud target needs a provider.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpulayer.errors import UsageError
from gpulayer.scheduler import WorkerSnapshot, never_reasons
from gpulayer.spec import JobSpec

TARGET_WORKER_KIND = {"local": "local", "remote": "remote", "cloud": "cloud"}


@dataclass
class TargetDecision:
    target: str | None
    """None: no target can take the job; it fails as unschedulable."""
    message: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def skipped(self) -> str | None:
        """The targets passed over before the chosen one, and why (kept as the job's message,
        so `status` names them as its log does)."""
        lines = [
            n for n in self.notes if n.startswith(("target ", "fallback ")) and " skipped: " in n
        ]
        return "; ".join(lines) or None


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


def with_default_target(spec_data: dict[str, Any], default: str) -> dict[str, Any]:
    """The spec data with ``placement.target`` set to the control plane's default where the
    spec names none: a team server has no local worker, so its default is remote. A spec that
    lists the default among its fallbacks is left to the schema's own default."""
    if not isinstance(spec_data, dict):
        return spec_data  # refused by validation, naming what is wrong
    placement = spec_data.get("placement")
    if placement is None:
        placement = {}
    if not isinstance(placement, dict) or "target" in placement:
        return spec_data
    fallbacks = placement.get("fallback_targets")
    if isinstance(fallbacks, list) and default in fallbacks:
        return spec_data
    return {**spec_data, "placement": {**placement, "target": default}}


class UnschedulableError(UsageError):
    """Nothing could ever run the job, known at submit: it is refused, not kept."""


def refuse_unschedulable(spec: JobSpec, decision: TargetDecision, where: str = "") -> None:
    """Raise when no target in the job's chain could ever run it. ``where`` prefixes the field
    (``jobs[3].`` in a list of jobs)."""
    if decision.target is not None:
        return
    chain = ", ".join(spec.placement.targets)
    raise UnschedulableError(
        f"{where}placement: unschedulable, nothing could ever run this job "
        f"(tried {chain}): {decision.message}{_hint(decision.message or '')}"
    )


_HINTS = {
    "no local worker is registered": "a team server runs jobs on its workers: give --target "
    "remote (or no target), or unset GPULAYER_SERVER to run on this machine",
    "no remote worker is registered": "start one with `gpulayer worker start --server URL "
    "--token-file FILE`, or let the job wait (placement.on_unschedulable: queue)",
}


def _hint(reasons: str) -> str:
    found = [hint for reason, hint in _HINTS.items() if reason in reasons]
    return f" (hint: {'; '.join(found)})" if found else ""


def refuse_missing_inputs(spec: JobSpec, base: Path) -> None:
    """Raise naming the first input whose local file or folder (relative to ``base``, the
    submit folder) does not exist."""
    from gpulayer.protocol.bundle import missing_local_inputs

    missing = missing_local_inputs([i.artifact for i in spec.inputs], base)
    for index, path in sorted(missing.items()):
        artifact = spec.inputs[index].artifact
        raise UsageError(f"inputs[{index}].artifact: {artifact!r} does not exist ({path})")


def refuse_unshipped_inputs(spec: JobSpec, shipped: Collection[int]) -> None:
    """A job that may run on another machine gets its local-path inputs only inside its
    bundle: a worker never opens a path of its own machine for a job, so one its bundle does
    not carry (``shipped``, by index) could only fail there, or read the wrong machine."""
    if not may_leave_this_machine(spec):
        return
    from gpulayer.protocol.bundle import is_machine_path

    for index, ref in enumerate(spec.inputs):
        if is_machine_path(ref.artifact) and index not in shipped:
            raise UsageError(
                f"inputs[{index}].artifact: {ref.artifact!r} is a path of the submitting "
                "machine, and a job that may run elsewhere gets such inputs only inside its "
                "bundle (the CLI and SDK put them there); use target local, or job:/s3:// "
                "artifacts"
            )


def may_leave_this_machine(spec: JobSpec) -> bool:
    """Whether any target in the job's chain runs it away from the submitting machine, where
    its submit folder must travel with it."""
    return any(target != "local" for target in spec.placement.targets)


def choose_target(
    spec: JobSpec,
    workers: Sequence[WorkerView],
    *,
    cloud_available: bool = False,
    cloud_refusal: Callable[[JobSpec], str | None] | None = None,
) -> TargetDecision:
    """``cloud_refusal`` says why no offer could ever take the job, known before anything
    is rented (a cost cap below every offer of the shipped catalogs; for a gang, below every
    offer), or None."""
    chain = spec.placement.targets
    notes: list[str] = []
    for position, target in enumerate(chain):
        last = position == len(chain) - 1
        if target == "cloud":
            refusal = None
            if cloud_available and cloud_refusal is not None:
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
            role = "target" if position == 0 else "fallback"
            notes.append(f"{role} {target} skipped: {summary}; trying {chain[position + 1]}")
            continue
        notes.append(f"unschedulable: {summary}")
        return TargetDecision(None, message=summary, notes=notes)
    raise AssertionError("a placement chain is never empty")


def target_after_cloud(
    spec: JobSpec, worker_views: Sequence[WorkerView]
) -> tuple[str | None, list[str]]:
    """The next target after cloud in the job's chain that can take it, else None and, per
    fallback target, why not."""
    chain = spec.placement.targets
    position = chain.index("cloud") if "cloud" in chain else len(chain) - 1
    refused: list[str] = []
    for target in chain[position + 1 :]:
        remaining = spec.model_copy(deep=True)
        remaining.placement.target = target  # type: ignore[assignment]
        remaining.placement.fallback_targets = list(chain[chain.index(target) + 1 :])  # type: ignore[arg-type]
        decision = choose_target(remaining, worker_views)
        if decision.target:
            return decision.target, []
        # The first decision walked the whole rest of the chain: its notes say, per
        # fallback target, why that one cannot run the job either.
        refused = refused or decision.notes
    return None, refused
