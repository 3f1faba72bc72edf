"""A gpulayer job array as one Slurm job array: one ``sbatch --array=TASKS%LIMIT`` whose every
task is the allocation of one gpulayer job (its array index is the task's id, so the job sees
``SLURM_ARRAY_TASK_ID`` equal to ``GPULAYER_ARRAY_INDEX``).

Each task has an allocation record of its own, written before ``sbatch`` with the task's Slurm
id filled in after (``JOBID_TASK``), so the task's own ``launch`` (its request id) finds it,
waits for that task to run and ends it alone (``scancel JOBID_TASK``): Slurm starts and ends
the tasks on their own, at most LIMIT at once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from gpulayer.cloud import CapacityError, LaunchRequest, Offer, ProviderError
from gpulayer_slurm import batch, parsing, regions
from gpulayer_slurm.allocations import Allocation, AllocationStore, job_name
from gpulayer_slurm.errors import PROVIDER
from gpulayer_slurm.login import LoginNode, add_key_command


class Submitter(Protocol):
    """What of the provider an array's submit uses (the SlurmProvider)."""

    allocations: AllocationStore

    def login(self, cluster: str) -> LoginNode: ...
    def queued(self, login: LoginNode, name: str) -> list[parsing.QueuedJob]: ...
    def forget(self, login: LoginNode, record: Allocation) -> None: ...
    def sbatch_shape(
        self, login: LoginNode, offer: Offer, partition: str, request: LaunchRequest
    ) -> dict[str, Any]: ...


ARRAY_TASK_TAG = "gpulayer:array-task"
"""The task id (the job's array index) each task's request carries."""


def submit_array(
    provider: Submitter, offer: Offer, requests: Sequence[LaunchRequest], limit: int | None
) -> list[str]:
    """One ``sbatch --array`` for ``requests`` (one per task, each naming its index in
    ``gpulayer:array-task``); each task's Slurm id (``JOBID_TASK``), in their order. Idempotent
    by the first request's id: a call made again finds the array it made."""
    if not requests:
        raise ProviderError("an array has at least one task", provider=PROVIDER)
    if offer.provider != PROVIDER or offer.zone is None:
        raise ProviderError(f"offer {offer.label} is not a slurm partition's", provider=PROVIDER)
    tasks = [_task_of(request) for request in requests]
    login = provider.login(regions.cluster_of(offer.region))
    first = provider.allocations.read(requests[0].request_id)
    if first is not None and first.slurm_job_id is None:
        # Written down, then no answer from sbatch: it may have gone through.
        found = provider.queued(login, first.job_name)
        if found:
            return _number(provider, requests, tasks, found[0].job_id.split("_")[0])
    if first is not None and first.slurm_job_id is not None:
        return [f"{first.slurm_job_id.split('_')[0]}_{task}" for task in tasks]
    name = job_name(requests[0].request_id, requests[0].job_name)
    records = [_record(login.name, offer, request, name) for request in requests]
    keys = [add_key_command(login, request) for request in requests]
    login.checked(" && ".join(keys), what="adding the jobs' keys to authorized_keys")
    for record in records:
        provider.allocations.write(record)  # before sbatch: a crash leaves records to find
    shared = {k: v for k, v in requests[0].tags.items() if k not in _PER_TASK}
    command = batch.sbatch_command(
        job_name=name,
        tags=shared,
        job_id=requests[0].job_id,
        array=(
            parsing.array_spec(tasks, limit),
            {task: r.job_id for task, r in zip(tasks, requests, strict=True)},
        ),
        **provider.sbatch_shape(login, offer, offer.zone, requests[0]),
    )
    done = login.run(command, once=True)
    slurm_job = done.stdout.strip().split(";")[0]
    if done.exit_code != 0 or not slurm_job.isdigit():
        for record in records:
            provider.forget(login, record)
        why = " | ".join((done.stderr or done.stdout).strip().splitlines()[-2:])
        raise CapacityError(
            "zone", PROVIDER, offer.region, offer.zone, f"sbatch refused the array: {why}"
        )
    ids = _number(provider, requests, tasks, slurm_job)
    if requests[0].progress is not None:
        requests[0].progress(
            f"slurm job array {slurm_job} ({len(tasks)} tasks, "
            f"--array={parsing.array_spec(tasks, limit)}) submitted to {offer.region}"
        )
    return ids


_PER_TASK = frozenset({"gpulayer:job", "gpulayer:request", ARRAY_TASK_TAG})
"""Tags of one task, left out of the array's comment (every task shows it)."""


def _task_of(request: LaunchRequest) -> int:
    text = request.tags.get(ARRAY_TASK_TAG, "")
    if not text.isdigit():
        raise ProviderError(
            f"launch request {request.request_id}: {ARRAY_TASK_TAG} is not a task id",
            provider=PROVIDER,
        )
    return int(text)


def _record(cluster: str, offer: Offer, request: LaunchRequest, name: str) -> Allocation:
    assert offer.zone is not None
    return Allocation(
        request_id=request.request_id,
        job_id=request.job_id,
        cluster=cluster,
        partition=offer.zone,
        instance_type=offer.instance_type,
        nodes=1,
        tags=dict(request.tags),
        name=request.job_name,
        array_name=name,
    )


def _number(
    provider: Submitter, requests: Sequence[LaunchRequest], tasks: list[int], slurm_job: str
) -> list[str]:
    """Each task's record gets its Slurm id, ``JOBID_TASK``."""
    ids = []
    for request, task in zip(requests, tasks, strict=True):
        record = provider.allocations.read(request.request_id)
        slurm_id = f"{slurm_job}_{task}"
        if record is not None:
            record.slurm_job_id = slurm_id
            provider.allocations.write(record)
        ids.append(slurm_id)
    return ids
