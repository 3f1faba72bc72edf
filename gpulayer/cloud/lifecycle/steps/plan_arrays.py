"""The plan step's part for a job array: the waiting jobs of one array that plan to the same
offer of a provider that makes arrays (:class:`~gpulayer.cloud.lifecycle.arrays.ArrayProvider`)
are written down together, one instance record per job (its task), before the one provider
call that the first task's launch makes (see :mod:`gpulayer.cloud.lifecycle.arrays`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpulayer.cloud.lifecycle import arrays, gangs
from gpulayer.cloud.lifecycle.steps.requested import requested_row
from gpulayer.cloud.lifecycle.steps.terminate import REQUEST_TAG
from gpulayer.cloud.lifecycle.world import HELD_FOR_NO_JOB

if TYPE_CHECKING:
    from gpulayer.cloud.lifecycle.ports import JobView
    from gpulayer.cloud.lifecycle.steps.context import StepContext
    from gpulayer.cloud.offer import Offer
    from gpulayer.cloud.protocol import Provider
    from gpulayer.spec import JobSpec


def record_array(
    ctx: StepContext,
    job: JobView,
    spec: JobSpec,
    offer: Offer,
    together: Sequence[str],
    start_launch: Callable[[str, str], None],
    providers: Mapping[str, Provider],
) -> set[str] | None:
    """Record ``job`` and the jobs of its array in ``together`` that may share its launch,
    and start the launch of the first task; the ids of the jobs recorded. None when the offer's
    provider makes no arrays, or no other job of the array may share it: the job is recorded
    on its own."""
    provider = providers.get(offer.provider)
    if not together or not isinstance(provider, arrays.ArrayProvider):
        return None
    members = [(job, spec), *_sharing(ctx, job.id, spec, together)]
    if len(members) < 2:
        return None
    tasks = sorted(
        (arrays.index_of(s.labels), j, s)
        for j, s in members
        if arrays.index_of(s.labels) is not None
    )
    if len(tasks) < 2 or len({index for index, _, _ in tasks}) != len(tasks):
        return None
    rows = _rows(
        ctx, offer, [(int(index), j) for index, j, _ in tasks], arrays.limit_of(spec.labels)
    )
    array_id = arrays.array_of(spec.labels)
    ctx.store.record_instances(
        rows, reason=f"offer {offer.label} for {len(rows)} jobs of array {array_id}, one launch"
    )
    ctx.store.end_capacity_waits([j.id for _, j, _ in tasks])
    for row in rows:
        ctx.service.begin_provisioning(
            row["job_id"],
            f"provisioning {offer.label} as task {row['tags'][arrays.ARRAY_TASK_TAG]} "
            f"of one array launch of {len(rows)}",
        )
    start_launch(rows[0]["request_id"], rows[0]["job_id"])
    return {j.id for _, j, _ in tasks}


def _sharing(
    ctx: StepContext, job_id: str, spec: JobSpec, together: Sequence[str]
) -> list[tuple[JobView, JobSpec]]:
    """The jobs of ``together`` that still wait for a machine, have none, and ask for what
    ``job_id`` asks for (the same spec but for its labels): one lone machine each."""
    from gpulayer.spec import JobSpec

    if gangs.nodes_of(spec) != 1:
        return []
    array_id = arrays.array_of(spec.labels)
    same = spec.model_dump(mode="json", exclude={"labels"})
    held = {
        r.job_id
        for r in ctx.store.list_instances(live_only=True)
        if r.job_id and r.state not in HELD_FOR_NO_JOB
    }
    found = []
    for other_id in together:
        if other_id == job_id or other_id in held:
            continue
        other = ctx.store.get_job(other_id)
        if other.target != "cloud" or other.state not in ("queued", "provisioning"):
            continue
        other_spec = JobSpec.model_validate(other.spec)
        if arrays.array_of(other_spec.labels) != array_id:
            continue
        if other_spec.model_dump(mode="json", exclude={"labels"}) != same:
            continue
        found.append((other, other_spec))
    return found


def _rows(
    ctx: StepContext, offer: Offer, tasks: list[tuple[int, JobView]], limit: int | None
) -> list[dict[str, Any]]:
    """One instance record per task, each with a job key of its own (its task ends on its
    own, and its key with it); the first task's launch makes the array's call."""
    from gpulayer.ids import new_id
    from gpulayer.ssh.keys import generate_keypair

    request_ids = [new_id("r", 12) for _ in tasks]
    rows = []
    for (index, job), request_id in zip(tasks, request_ids, strict=True):
        keys = generate_keypair(ctx.keys_dir, request_id)
        tags = {
            "gpulayer:owner": ctx.owner,
            "gpulayer:job": job.id,
            REQUEST_TAG: request_id,
            arrays.ARRAY_LAUNCH_TAG: request_ids[0],
            arrays.ARRAY_TASK_TAG: str(index),
        }
        if limit is not None:
            tags[arrays.ARRAY_LIMIT_TAG] = str(limit)
        rows.append(
            requested_row(
                offer,
                request_id=request_id,
                job_id=job.id,
                owner=ctx.owner,
                key_path=str(keys.private_path),
                tags=tags,
                launch_id=None,
                node_rank=0,
                fleet=None,
            )
        )
    return rows
