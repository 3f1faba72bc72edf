"""Why a batch system ends the worker it launched.

A worker that a Slurm allocation's step started (the Slurm provider hands the worker's start
to it) gets SIGTERM alike for a preemption, an ``scancel`` and the allocation's time limit.
Only a preemption is the machine taken back, which a job may retry on (``preempted``); the
others end the worker under its job (``worker_lost``). Slurm has already written down why
when it signals the step, so the worker asks.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Mapping

_JOB_STATE = re.compile(r"(?:^|\s)JobState=(\S+)")
_PREEMPT_TIME = re.compile(r"(?:^|\s)PreemptTime=(\S+)")
_NO_TIME = frozenset({"None", "Unknown", "(null)"})
_ANSWER_SECONDS = 10.0


def job_state(scontrol_output: str) -> str | None:
    """How ``scontrol -o show job`` output says the job ended: PREEMPTED, CANCELLED, TIMEOUT...
    While its nodes still end its processes Slurm shows the job COMPLETING, not the state it
    will end in (that waits for this worker to exit), but a preemption has set PreemptTime."""
    preempted = _PREEMPT_TIME.search(scontrol_output)
    if preempted and preempted.group(1) not in _NO_TIME:
        return "PREEMPTED"
    found = _JOB_STATE.search(scontrol_output)
    return found.group(1) if found else None


def slurm_job_state(
    env: Mapping[str, str],
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
) -> str | None:
    """The state Slurm gives the allocation this worker runs in; None outside Slurm or when
    Slurm does not answer (then nothing tells a preemption apart)."""
    job = env.get("SLURM_JOB_ID", "")
    if not job.isdigit():
        return None
    try:
        done = run(
            ["scontrol", "-o", "show", "job", job],
            capture_output=True,
            text=True,
            timeout=_ANSWER_SECONDS,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return job_state(done.stdout) if done.returncode == 0 else None


def stop_reason(state: str | None) -> tuple[str, str]:
    """(attempt reason, message) for a worker on a rented machine told to stop from outside:
    a preemption when the batch system says so or when nothing says otherwise (a cloud's
    spot reclaim, a stop from its console), else the worker lost under its job."""
    if state is None or state == "PREEMPTED":
        what = "slurm preempted the allocation" if state else "the machine is shutting down"
        return "preempted", what
    if state == "COMPLETING":  # ended, the reason not shown yet: not a preemption
        return "worker_lost", "slurm ended the allocation"
    return "worker_lost", f"slurm ended the allocation ({state.lower()})"
