"""Submitting jobs: one, an array, or a list of them in one transaction."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Response
from pydantic import BaseModel, ConfigDict, Field

from gpulayer.control.bundle_store import DIGEST_PREFIX, parse_digest
from gpulayer.control.client_paths import refuse_client_paths
from gpulayer.control.json_route import OffLoopJSONRoute
from gpulayer.control.reserved_labels import reserved_label_lines
from gpulayer.control.routes.deps import ID_MAX, ApiContext, Context, admin_only, once_key
from gpulayer.control.routes.details import job_detail
from gpulayer.control.store.once_keys import KeyTaken, OnceKey
from gpulayer.control.text_checks import unsafe_text
from gpulayer.control.uploads import incoming_bundle
from gpulayer.control.views import job_view
from gpulayer.errors import SpecError, UsageError
from gpulayer.spec.submit_arch import machine_arch, with_submit_arch

router = APIRouter(route_class=OffLoopJSONRoute)


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ArrayRequest(_Body):
    """An array's jobs: one per index, at most ``limit`` of them running at once."""

    indices: list[Annotated[int, Field(ge=0, le=ID_MAX)]] = Field(min_length=1, max_length=10_000)
    limit: Annotated[int, Field(ge=1, le=10_000)] | None = None


class SubmitBody(_Body):
    spec: dict[str, Any]
    array: ArrayRequest | None = None
    working_dir: str | None = None
    bundle_id: str | None = None
    source_dir: str | None = None
    client_env: dict[str, str] | None = None
    client_arch: Annotated[str, Field(max_length=64)] | None = None
    """The submitting machine's CPU architecture (platform.machine()): a rented machine's
    when the job names none; one gpulayer does not know sets nothing."""


# Checked inside (service.submissions.submit for the spec): a refused job must not leave its bundle.
# A list is several jobs in one transaction, answered with their views in order. A
# request sent again with its Idempotency-Key is answered with the jobs it made first.
@router.post("/v1/jobs", dependencies=[Depends(admin_only)], status_code=201)
def submit(
    body: Annotated[list[SubmitBody], Field(min_length=1, max_length=10_000)] | SubmitBody,
    response: Response,
    context: Context,
    once: OnceKey | None = Depends(once_key),
) -> Any:
    many = isinstance(body, list) or body.array is not None
    answers = context.answers
    try:
        made = answers.prior(once)
        if made is None:
            if isinstance(body, list):
                return _submit_many(context, body, once)
            return _submit(context, body, once)
    except KeyTaken:
        made = answers.prior(once)  # a concurrent duplicate made them: answer with those
        if made is None:
            raise
    response.headers["Idempotent-Replayed"] = "true"
    if many:
        return [job_view(job) for job in context.service.store.get_jobs(made)]
    return job_detail(context.service, made[0])


def _submit(context: ApiContext, body: SubmitBody, once: OnceKey | None) -> Any:
    service, embedded = context.service, context.embedded
    refuse_client_paths(
        embedded=embedded,
        working_dir=body.working_dir,
        source_dir=body.source_dir,
        has_bundle=body.bundle_id is not None,
    )
    reserved = reserved_label_lines(body.spec)
    if reserved:
        raise SpecError(reserved)
    body.spec = with_submit_arch(body.spec, _arch_of(body.client_arch))
    if body.array is not None:
        return _submit_array(context, body, once)
    digest = parse_digest(body.bundle_id) if body.bundle_id else None
    bundle = None if digest is not None else incoming_bundle(service, body.bundle_id)
    problems = unsafe_text(body.model_dump(exclude={"spec"}))
    if problems:
        if bundle is not None:
            bundle.unlink(missing_ok=True)
        raise SpecError(problems)
    warnings: list[str] = []
    job = service.submissions.submit(
        body.spec,
        working_dir=body.working_dir,
        bundle=bundle,
        source_dir=Path(body.source_dir) if body.source_dir else None,
        client_env=body.client_env if embedded else None,
        warnings=warnings,
        bundle_digest=digest,
        once=once,
    )
    view = job_detail(service, job.id)
    if warnings:
        view["warnings"] = warnings
    return view


def _submit_array(context: ApiContext, body: SubmitBody, once: OnceKey | None) -> Any:
    from gpulayer.control.array_submit import submit_array

    assert body.array is not None
    problems = unsafe_text(body.model_dump(exclude={"spec"}))
    if problems:
        raise SpecError(problems)
    jobs = submit_array(
        context.service,
        body.spec,
        body.array.indices,
        body.array.limit,
        embedded=context.embedded,
        working_dir=body.working_dir,
        source_dir=body.source_dir,
        bundle_id=body.bundle_id,
        client_env=body.client_env if context.embedded else None,
        once=once,
    )
    return [job_view(job) for job in jobs]


def _submit_many(
    context: ApiContext, bodies: list[SubmitBody], once: OnceKey | None
) -> list[dict[str, Any]]:
    items: list[tuple[dict[str, Any], str | None, str | None]] = []
    problems: list[str] = []
    # The local control plane keeps each job's submitting environment, as for one job.
    client_envs = [body.client_env for body in bodies] if context.embedded else None
    for index, body in enumerate(bodies):
        problems += [
            f"jobs[{index}].{line}" for line in unsafe_text(body.model_dump(exclude={"spec"}))
        ]
        problems += reserved_label_lines(body.spec, f"jobs[{index}].")
        spec = with_submit_arch(body.spec, _arch_of(body.client_arch))
        items.append((spec, body.working_dir, _one_of_many(context, body, index)))
    if problems:
        raise SpecError(problems)
    made = context.service.submissions.submit_many(items, once=once, client_envs=client_envs)
    return [job_view(job) for job in made]


def _one_of_many(context: ApiContext, body: SubmitBody, index: int) -> str | None:
    """The bundle digest of a list's job ``index``, once its fields suit a list."""
    if body.array is not None:
        raise UsageError(f"jobs[{index}].array: an array is a request of its own")
    if body.source_dir is not None:
        raise UsageError(f"jobs[{index}].source_dir: a list's jobs send their source as a bundle")
    if body.client_env is not None and not context.embedded:
        raise UsageError(f"jobs[{index}].client_env: only the local control plane takes it")
    refuse_client_paths(
        embedded=context.embedded,
        working_dir=body.working_dir,
        source_dir=None,
        has_bundle=body.bundle_id is not None,
        where=f"jobs[{index}].",
    )
    if body.bundle_id is None:
        return None
    digest = parse_digest(body.bundle_id, f"jobs[{index}].bundle_id")
    if digest is None:
        raise UsageError(
            f"jobs[{index}].bundle_id: a list of jobs takes {DIGEST_PREFIX} bundle ids"
        )
    return digest


def _arch_of(client_arch: str | None) -> str | None:
    """The submitting machine's architecture: the client's when it says, else this control
    plane's own (the submitting machine, for the local one)."""
    return machine_arch(client_arch) if client_arch is not None else machine_arch()

