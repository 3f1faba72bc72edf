"""Rented machines: their cost, their instances, the offers and plan for a spec, a reap."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from gpulayer.control.json_route import OffLoopJSONRoute
from gpulayer.control.routes.deps import ADMIN, ApiContext, Context
from gpulayer.control.routes.details import instances_detail
from gpulayer.control.views import cost_view
from gpulayer.errors import UsageError
from gpulayer.spec.submit_arch import machine_arch, with_submit_arch

router = APIRouter(route_class=OffLoopJSONRoute)

_OFFERS_MAX = 10_000


@router.get("/v1/cost", dependencies=ADMIN)
def cost(context: Context, job: str | None = None) -> dict[str, Any]:
    service = context.service
    job_id = service.jobs.resolve_job_id(job) if job else None
    return cost_view(service.store.list_instances(job_id=job_id))


@router.get("/v1/instances", dependencies=ADMIN)
def instances(context: Context, all: bool = False, job: str | None = None) -> list[dict[str, Any]]:
    service = context.service
    job_id = service.jobs.resolve_job_id(job) if job else None
    return instances_detail(service, job_id=job_id, live_only=not all and job_id is None)


@router.post("/v1/offers", dependencies=ADMIN)
def offers(body: dict[str, Any], context: Context) -> dict[str, Any]:
    from gpulayer.cloud.search import FIELD_NAMES, list_offers
    from gpulayer.spec.validate import validate_spec

    limit = body.get("limit", 30)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 0 <= limit <= _OFFERS_MAX:
        raise UsageError(f"limit: a whole number from 0 to {_OFFERS_MAX}")
    names = body.get("names") or {}
    if not isinstance(names, dict) or not all(
        k in FIELD_NAMES and isinstance(v, str) and v for k, v in names.items()
    ):
        raise UsageError(f"names: an object whose keys are among {', '.join(FIELD_NAMES)}")
    spec = validate_spec(body.get("spec") or {})
    from gpulayer.cloud.credentials import using_environment

    with using_environment(_client_credentials(body, context)):
        return list_offers(
            context.service.layout.root,
            spec,
            gpu_count_exact=body.get("gpu_count_exact") is not False,
            include_disabled=body.get("include_disabled") is not False,
            limit=limit,
            names=names,
        )


@router.post("/v1/plan", dependencies=ADMIN)
def plan(body: dict[str, Any], context: Context) -> dict[str, Any]:
    spec = body.get("spec")
    if not isinstance(spec, dict):
        raise UsageError("spec: a job spec (an object)")
    working_dir = body.get("working_dir")
    if working_dir is not None and not isinstance(working_dir, str):
        raise UsageError("working_dir: a path (a string)")
    arch = body.get("client_arch")
    if arch is not None and not isinstance(arch, str):
        raise UsageError("client_arch: a machine architecture (a string)")
    # As for a submit: only the local control plane reads this machine's folders, and asks
    # the clouds with the caller's credentials.
    return context.service.submissions.plan(
        with_submit_arch(spec, machine_arch(arch) if arch is not None else machine_arch()),
        working_dir=working_dir if context.embedded else None,
        cloud_env=_client_credentials(body, context),
    )


def _client_credentials(body: dict[str, Any], context: ApiContext) -> dict[str, str] | None:
    """The caller's cloud credential variables (``client_env``), which the local control plane
    asks the clouds with for this one call, as for a submit; a team server takes none. Held in
    memory only: never stored, logged or echoed."""
    given = body.get("client_env")
    if given is None or not context.embedded:
        return None
    if not isinstance(given, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in given.items()
    ):
        raise UsageError("client_env: an object whose values are strings")
    from gpulayer.cloud.credentials import credential_variables

    return credential_variables(given)


@router.post("/v1/reap", dependencies=ADMIN)
def reap(context: Context, dry_run: bool = False) -> list[dict[str, Any]]:
    return context.service.cloud.reap(dry_run=dry_run) or []
