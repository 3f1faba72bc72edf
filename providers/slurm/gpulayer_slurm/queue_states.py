"""What squeue's line of an allocation says about it, as gpulayer reads it. Pure."""

from __future__ import annotations

from gpulayer.cloud import InstanceState
from gpulayer_slurm import parsing
from gpulayer_slurm.ending import ENDED

ARRAY_WAIT_REASON = "JobArrayTaskLimit"
"""A job array's task held back by the array's own ``%LIMIT``: it waits for the array's
earlier tasks, not for the cluster's capacity."""


def pending_note(slurm_job_id: str | None, job: parsing.QueuedJob) -> str:
    """What a launch says while its allocation waits: for capacity only when Slurm gives a
    reason (Resources, Priority, a limit); a job Slurm's scheduler has not looked at yet
    (reason None) waits for nothing but that."""
    if job.reason == ARRAY_WAIT_REASON:
        return f"slurm job {slurm_job_id} waits for its array's earlier tasks ({job.reason})"
    if job.reason in ("None", ""):
        return f"slurm job {slurm_job_id} is {job.state.lower()}, not yet scheduled"
    return f"waiting for capacity: slurm job {slurm_job_id} is {job.state.lower()} ({job.reason})"


def instance_state(job: parsing.QueuedJob | None, *, ran: bool) -> tuple[InstanceState, bool]:
    """(state, reclaimed) of an allocation as squeue shows it (None: no longer shown)."""
    if job is None:
        return "terminated", False
    if job.state == "PREEMPTED":
        return "terminated", True
    if job.state in ENDED:
        return "terminated", False
    if job.state in ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"):
        # Pending again after it ran: Slurm requeued it (a preemption or a node failure).
        return "pending", ran
    if job.state == "RUNNING":
        return "running", False
    return "stopping", False
