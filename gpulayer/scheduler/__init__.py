"""Placement over a snapshot of workers: feasibility checks, then a ranking strategy. Pure."""

from gpulayer.scheduler.errors import (
    DuplicateWorker,
    InvalidSnapshot,
    SchedulerError,
    UnknownStrategy,
    UnknownWorker,
)
from gpulayer.scheduler.feasibility import CHECKS, Check, check, reasons_never, reasons_now
from gpulayer.scheduler.gang import (
    choose_gang,
    closest_gang,
    fitting_now,
    never_reasons,
    node_count,
)
from gpulayer.scheduler.gpus import pick_gpus
from gpulayer.scheduler.index import WorkerIndex
from gpulayer.scheduler.outcome import Explanation, Placement, Unplaced
from gpulayer.scheduler.placement import explain, place, place_by_scan
from gpulayer.scheduler.queue import (
    DEFAULT_STARVATION_SECONDS,
    Assignment,
    PlanResult,
    QueuedJob,
    Reservation,
    plan,
    plan_pass,
)
from gpulayer.scheduler.snapshot import WorkerSnapshot, idle_snapshot
from gpulayer.scheduler.strategies import STRATEGIES, rank, rank_key

__all__ = [
    "CHECKS",
    "DEFAULT_STARVATION_SECONDS",
    "STRATEGIES",
    "Assignment",
    "Check",
    "DuplicateWorker",
    "Explanation",
    "InvalidSnapshot",
    "Placement",
    "PlanResult",
    "QueuedJob",
    "Reservation",
    "SchedulerError",
    "UnknownStrategy",
    "UnknownWorker",
    "Unplaced",
    "WorkerIndex",
    "WorkerSnapshot",
    "check",
    "choose_gang",
    "closest_gang",
    "explain",
    "fitting_now",
    "idle_snapshot",
    "never_reasons",
    "node_count",
    "pick_gpus",
    "place",
    "place_by_scan",
    "plan",
    "plan_pass",
    "rank",
    "rank_key",
    "reasons_never",
    "reasons_now",
]
