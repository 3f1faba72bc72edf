"""Why a batch system ends the worker it launched: Slurm's record of the job. Pure, with the
scontrol call given its answer."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from gpulayer.worker.batch_system import job_state, slurm_job_state, stop_reason

SHOW_JOB = (
    "JobId=42 JobName=gpulayer-r1 UserId=gl(1000) GroupId=gl(1000) Priority=1 "
    "JobState={state} Reason=None Dependency=(null) Requeue=0 Restarts=0 BatchFlag=1 "
    "PreemptEligibleTime=2026-12-03T09:50:01 PreemptTime={preempt_time} "
    "NodeList=cpu1 Comment=gpulayer:job=j1\n"
)


def test_job_state_is_read_from_one_line_records() -> None:
    assert job_state(SHOW_JOB.format(state="PREEMPTED", preempt_time="None")) == "PREEMPTED"
    assert job_state(SHOW_JOB.format(state="CANCELLED", preempt_time="None")) == "CANCELLED"
    # While the nodes end its processes the job shows COMPLETING; a preemption set its time.
    completing = SHOW_JOB.format(state="COMPLETING", preempt_time="2026-12-03T09:50:07")
    assert job_state(completing) == "PREEMPTED"
    assert job_state(SHOW_JOB.format(state="COMPLETING", preempt_time="None")) == "COMPLETING"
    assert job_state("JobId=42 OldJobState=RUNNING") is None
    assert job_state("") is None


def _answer(code: int, out: str) -> Any:
    asked: list[list[str]] = []

    def run(args: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        asked.append(args)
        return subprocess.CompletedProcess(args, code, out, "")

    return run, asked


def test_the_worker_asks_slurm_about_its_own_allocation_only() -> None:
    run, asked = _answer(0, SHOW_JOB.format(state="TIMEOUT", preempt_time="None"))
    assert slurm_job_state({"SLURM_JOB_ID": "42"}, run) == "TIMEOUT"
    assert asked == [["scontrol", "-o", "show", "job", "42"]]
    assert slurm_job_state({}, run) is None and len(asked) == 1
    assert slurm_job_state({"SLURM_JOB_ID": "42; rm -rf /"}, run) is None and len(asked) == 1
    refused, _ = _answer(1, "")
    assert slurm_job_state({"SLURM_JOB_ID": "42"}, refused) is None

    def missing(args: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError("scontrol")

    assert slurm_job_state({"SLURM_JOB_ID": "42"}, missing) is None


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        (None, "preempted"),
        ("PREEMPTED", "preempted"),
        ("CANCELLED", "worker_lost"),
        ("TIMEOUT", "worker_lost"),
        ("NODE_FAIL", "worker_lost"),
        ("COMPLETING", "worker_lost"),
    ],
)
def test_only_a_preemption_or_a_silent_machine_is_a_preemption(
    state: str | None, reason: str
) -> None:
    got, message = stop_reason(state)
    assert got == reason
    if state not in (None, "PREEMPTED", "COMPLETING"):
        assert state is not None and state.lower() in message
