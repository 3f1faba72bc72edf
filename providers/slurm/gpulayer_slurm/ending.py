"""How gpulayer ends an allocation, as Slurm's users would read it afterwards.

A job that ended by itself ends its allocation COMPLETED: the batch script is told to return
(:func:`gpulayer_slurm.batch.end_command`), nothing is cancelled. A job that was cancelled, ran
out of time or failed to start ends it CANCELLED (``scancel``), and so does an allocation whose
batch script has not returned within ``finish_wait_seconds`` of being told. Either way the end
is recorded before Slurm is asked (so gpulayer's own end is not read as a preemption), waited
for, and the job's key leaves the login node.
"""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Callable

from gpulayer.cloud import ProviderError, remove_authorized_key_command
from gpulayer_slurm import batch, parsing
from gpulayer_slurm.allocations import Allocation, AllocationStore
from gpulayer_slurm.errors import PROVIDER
from gpulayer_slurm.login import LoginNode

JOB_NAME_PREFIX = "gpulayer-"
# Slurm's end states, as squeue shows them for MinJobAge after the end.
ENDED = frozenset(
    {
        "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
        "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT", "SPECIAL_EXIT", "REVOKED",
    }
)  # fmt: skip
POLL_SECONDS = 1.0
CANCEL_WAIT_SECONDS = 60.0

Queued = Callable[[LoginNode], list[parsing.QueuedJob]]


class Ending:
    def __init__(self, allocations: AllocationStore, queued: Queued) -> None:
        self._allocations = allocations
        self._queued = queued

    def cancel(self, login: LoginNode, records: list[Allocation]) -> None:
        """scancel the allocations, wait until Slurm has ended them, remove their keys."""
        self._mark_ended_by_us(records)
        ours = [j.job_id for j in self._ours(login, records)]
        self._scancel(login, ours)
        self.remove_keys(login, records)

    def finish(self, login: LoginNode, records: list[Allocation], patience: float) -> None:
        """Tell the running allocations' batch scripts to return (COMPLETED); scancel those
        still pending and those that have not ended after ``patience`` seconds."""
        self._mark_ended_by_us(records)
        ours = self._ours(login, records)
        running = [j.job_id for j in ours if j.state == "RUNNING"]
        ending = [j.job_id for j in ours if j.state == "COMPLETING"]
        rest = [j.job_id for j in ours if j.state not in ("RUNNING", "COMPLETING")]
        if running:
            login.checked(batch.end_command(running), what="telling the batch script to end")
        left = self._wait_ended(login, [*running, *ending], patience)
        self._scancel(login, [*rest, *left])
        self.remove_keys(login, records)

    def remove_keys(self, login: LoginNode, records: list[Allocation]) -> None:
        for record in records:
            if record.request_id:
                login.checked(
                    remove_authorized_key_command(login.cluster.authorized_keys, record.request_id),
                    what="removing the job's key from authorized_keys",
                )

    def remove_key(self, login: LoginNode, record: Allocation) -> None:
        """Best effort: a terminate removes it again."""
        with contextlib.suppress(ProviderError):
            self.remove_keys(login, [record])

    def _mark_ended_by_us(self, records: list[Allocation]) -> None:
        for record in records:
            if record.request_id and self._allocations.read(record.request_id) is not None:
                record.cancelled = True
                self._allocations.write(record)  # before Slurm is asked: ours, not a preemption

    def _ours(self, login: LoginNode, records: list[Allocation]) -> list[parsing.QueuedJob]:
        """The records' allocations still queued or running. Only jobs this provider submitted
        (by their name) are ever ended."""
        wanted = {r.slurm_job_id for r in records}
        return [
            j
            for j in self._queued(login)
            if j.job_id in wanted and j.name.startswith(JOB_NAME_PREFIX) and j.state not in ENDED
        ]

    def _scancel(self, login: LoginNode, slurm_job_ids: list[str]) -> None:
        if not slurm_job_ids:
            return
        login.checked(shlex.join(["scancel", *slurm_job_ids]), what="scancel")
        left = self._wait_ended(login, slurm_job_ids, CANCEL_WAIT_SECONDS)
        if left:
            raise ProviderError(
                f"{login.name}: slurm jobs {', '.join(left)} not ended "
                f"{CANCEL_WAIT_SECONDS:g} s after scancel",
                provider=PROVIDER,
            )

    def _wait_ended(self, login: LoginNode, slurm_job_ids: list[str], patience: float) -> list[str]:
        """Those of ``slurm_job_ids`` still live after ``patience`` seconds."""
        deadline = time.monotonic() + patience
        left = list(slurm_job_ids)
        while left:
            live = {j.job_id for j in self._queued(login) if j.state not in ENDED}
            left = [j for j in left if j in live]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(POLL_SECONDS)
        return left
