"""The control plane's HTTP API (FastAPI). Thin: parse, call the service, shape the answer."""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpulayer import __version__
from gpulayer.control.arrays import ARRAY_ID
from gpulayer.control.auth import LOCAL_ADMIN, Principal
from gpulayer.control.body_caps import route_caps
from gpulayer.control.body_pipe import read_body_on_a_thread
from gpulayer.control.bundle_store import DIGEST_PREFIX, parse_digest
from gpulayer.control.claim_poll import claim_long_poll
from gpulayer.control.client_paths import refuse_client_paths
from gpulayer.control.edge import RequestEdge
from gpulayer.control.idempotency import HEADER as IDEMPOTENCY_HEADER
from gpulayer.control.idempotency import Answers, TokenShownOnce, request_key
from gpulayer.control.json_route import OffLoopJSONRoute
from gpulayer.control.output_uploads import UploadTooLarge, receive_within
from gpulayer.control.reserved_labels import reserved_label_lines
from gpulayer.control.service import ControlService
from gpulayer.control.store.once_keys import KeyTaken, OnceKey
from gpulayer.control.text_checks import repaired, unsafe_text
from gpulayer.control.uploads import incoming_bundle, receive_to_file
from gpulayer.control.views import (
    cost_view,
    job_view,
    lifecycle_view,
    log_view,
    token_view,
    worker_view,
)
from gpulayer.errors import (
    ForbiddenError,
    GpulayerError,
    NotFoundError,
    SpecError,
    StaleAttemptError,
    UsageError,
)
from gpulayer.protocol.messages import (
    SETUP_LOG_PREFIX,
    AttemptReport,
    FinishBatch,
    FinishOutcome,
    FinishReply,
    Heartbeat,
    LogBatch,
    Registration,
    TokenRequest,
)
from gpulayer.spec.models import MAX_NODES

log = logging.getLogger("gpulayer.api")

_MAX_WAIT_SECONDS = 30.0
_STATUS: dict[type[GpulayerError], int] = {
    NotFoundError: 404,
    ForbiddenError: 403,
    StaleAttemptError: 409,
    UsageError: 400,
    UploadTooLarge: 413,
    TokenShownOnce: 409,
}

# The store's id columns are INTEGER: 32 bits in PostgreSQL, so that is the largest id.
_ID_MAX = 2**31 - 1
_AGE_MAX = 100 * 365.25 * 86400  # older than a century: older than any row
_OFFERS_MAX = 10_000
# Routes that take a file rather than JSON say so in the OpenAPI document.
_ARCHIVE_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}

# Every number a route takes fits the store's columns: a bigger one is the caller's mistake
# (422), not the database driver's overflow (500).
RowId = Annotated[int, PathParam(ge=0, le=_ID_MAX)]
Cursor = Annotated[int, Query(ge=0, le=_ID_MAX)]
Limit = Annotated[int, Query(ge=1, le=10_000)]
WaitSeconds = Annotated[float, Query(ge=0, allow_inf_nan=False)]
NodeRank = Annotated[int | None, Query(ge=0, le=MAX_NODES - 1)]
ArrayId = Annotated[str, PathParam(pattern=f"^{ARRAY_ID.pattern}$")]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ArrayRequest(_Body):
    """An array's jobs: one per index, at most ``limit`` of them running at once."""

    indices: list[Annotated[int, Field(ge=0, le=_ID_MAX)]] = Field(min_length=1, max_length=10_000)
    limit: Annotated[int, Field(ge=1, le=10_000)] | None = None


class SubmitBody(_Body):
    spec: dict[str, Any]
    array: ArrayRequest | None = None
    working_dir: str | None = None
    bundle_id: str | None = None
    source_dir: str | None = None
    client_env: dict[str, str] | None = None


class DeleteBody(_Body):
    jobs: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(min_length=1)
    dry_run: bool = False


class PruneBody(_Body):
    older_than_seconds: Annotated[float, Field(ge=0, le=_AGE_MAX, allow_inf_nan=False)]
    dry_run: bool = False


class SafeJSONResponse(JSONResponse):
    """A JSON answer that renders whatever a row holds: text a client cannot decode or a NaN
    stored before input was checked is repaired rather than failing the whole listing."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except (UnicodeEncodeError, ValueError):
            return super().render(repaired(content))


Authenticator = Callable[..., "Principal | None"]
"""(token, client address=None) -> its principal, or None when unknown, revoked or expired."""


def single_token(token: str) -> Authenticator:
    expected = token.encode()

    def check(given: str, _client: str | None = None) -> Principal | None:
        return LOCAL_ADMIN if hmac.compare_digest(given.encode(), expected) else None

    return check


def create_app(
    service: ControlService,
    authenticate: Authenticator,
    *,
    embedded: bool = False,
    extra_routes: Callable[[FastAPI, list[Any]], None] | None = None,
) -> FastAPI:
    """``extra_routes(app, admin_auth)`` adds the embedded daemon's own routes."""
    app = FastAPI(
        title="gpulayer control plane",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        default_response_class=SafeJSONResponse,
    )
    app.router.route_class = OffLoopJSONRoute  # before any route is added

    def caller(request: Request) -> Principal:
        service.touch()
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        client = request.client.host if request.client is not None else None
        principal = authenticate(given, client) if scheme.lower() == "bearer" and given else None
        if principal is None:
            raise _Unauthorized("missing, wrong, revoked or expired token")
        return principal

    def admin_only(request: Request) -> None:
        if caller(request).kind != "admin":
            raise _Unauthorized("this token may only run a worker")

    @app.exception_handler(_Unauthorized)
    async def _unauthorized(_request: Request, exc: _Unauthorized) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=401)

    _install_error_handlers(app)

    async def storable_text(request: Request) -> None:
        """Refuse, naming the field, strings that no store can hold (see text_checks)."""
        problems = unsafe_text(dict(request.path_params)) + unsafe_text(dict(request.query_params))
        if request.headers.get("content-type", "").startswith("application/json"):
            try:
                body = await request.json()
            except Exception:
                body = None  # the route's own parsing answers for a body that is not JSON
            problems += await asyncio.to_thread(unsafe_text, body)  # bodies run to MiBs
        if problems:
            raise SpecError(problems)

    checked = Depends(storable_text)
    auth = [Depends(admin_only), checked]

    @app.get("/v1/health")
    def health() -> dict[str, Any]:
        import os

        return {"ok": True, "version": __version__, "embedded": embedded, "pid": os.getpid()}

    @app.get("/v1/server", dependencies=[Depends(admin_only)])
    def server_state() -> dict[str, Any]:
        """For operators: how many workers' claim long-polls wait for work right now."""
        return {"version": __version__, "claim_polls_waiting": service.news.listening()}

    # --- jobs ---------------------------------------------------------------------------------

    answers = Answers(service.store)

    async def once_key(request: Request) -> OnceKey | None:
        """The create request's Idempotency-Key, bound to its caller and its body's sha256."""
        raw = request.headers.get(IDEMPOTENCY_HEADER)
        if raw is None:
            return None
        who = await asyncio.to_thread(caller, request)
        return request_key(who, raw, request.method, request.url.path, await request.body())

    # Checked inside (service.submit for the spec): a refused job must not leave its bundle.
    # A list is several jobs in one transaction, answered with their views in order. A
    # request sent again with its Idempotency-Key is answered with the jobs it made first.
    @app.post("/v1/jobs", dependencies=[Depends(admin_only)], status_code=201)
    def submit(
        body: Annotated[list[SubmitBody], Field(min_length=1, max_length=10_000)] | SubmitBody,
        response: Response,
        once: OnceKey | None = Depends(once_key),
    ) -> Any:
        many = isinstance(body, list) or body.array is not None
        try:
            made = answers.prior(once)
            if made is None:
                return _submit_many(body, once) if isinstance(body, list) else _submit(body, once)
        except KeyTaken:
            made = answers.prior(once)  # a concurrent duplicate made them: answer with those
            if made is None:
                raise
        response.headers["Idempotent-Replayed"] = "true"
        if many:
            return [job_view(job) for job in service.store.get_jobs(made)]
        return _job(service, made[0])

    def _submit(body: SubmitBody, once: OnceKey | None) -> dict[str, Any]:
        refuse_client_paths(
            embedded=embedded,
            working_dir=body.working_dir,
            source_dir=body.source_dir,
            has_bundle=body.bundle_id is not None,
        )
        reserved = reserved_label_lines(body.spec)
        if reserved:
            raise SpecError(reserved)
        if body.array is not None:
            return _submit_array(body, once)
        digest = parse_digest(body.bundle_id) if body.bundle_id else None
        bundle = None if digest is not None else incoming_bundle(service, body.bundle_id)
        problems = unsafe_text(body.model_dump(exclude={"spec"}))
        if problems:
            if bundle is not None:
                bundle.unlink(missing_ok=True)
            raise SpecError(problems)
        warnings: list[str] = []
        job = service.submit(
            body.spec,
            working_dir=body.working_dir,
            bundle=bundle,
            source_dir=Path(body.source_dir) if body.source_dir else None,
            client_env=body.client_env if embedded else None,
            warnings=warnings,
            bundle_digest=digest,
            once=once,
        )
        view = _job(service, job.id)
        if warnings:
            view["warnings"] = warnings
        return view

    def _submit_array(body: SubmitBody, once: OnceKey | None) -> Any:
        from gpulayer.control.array_submit import submit_array

        assert body.array is not None
        problems = unsafe_text(body.model_dump(exclude={"spec"}))
        if problems:
            raise SpecError(problems)
        jobs = submit_array(
            service,
            body.spec,
            body.array.indices,
            body.array.limit,
            embedded=embedded,
            working_dir=body.working_dir,
            source_dir=body.source_dir,
            bundle_id=body.bundle_id,
            client_env=body.client_env if embedded else None,
            once=once,
        )
        return [job_view(job) for job in jobs]

    def _submit_many(bodies: list[SubmitBody], once: OnceKey | None) -> list[dict[str, Any]]:
        items: list[tuple[dict[str, Any], str | None, str | None]] = []
        problems: list[str] = []
        for index, body in enumerate(bodies):
            problems += [
                f"jobs[{index}].{line}" for line in unsafe_text(body.model_dump(exclude={"spec"}))
            ]
            problems += reserved_label_lines(body.spec, f"jobs[{index}].")
            if body.array is not None:
                raise UsageError(f"jobs[{index}].array: an array is a request of its own")
            if body.source_dir is not None or body.client_env is not None:
                raise UsageError(f"jobs[{index}]: source_dir and client_env go one job at a time")
            refuse_client_paths(
                embedded=embedded,
                working_dir=body.working_dir,
                source_dir=None,
                has_bundle=body.bundle_id is not None,
                where=f"jobs[{index}].",
            )
            digest = None
            if body.bundle_id is not None:
                digest = parse_digest(body.bundle_id, f"jobs[{index}].bundle_id")
                if digest is None:
                    raise UsageError(
                        f"jobs[{index}].bundle_id: a list of jobs takes {DIGEST_PREFIX} bundle ids"
                    )
            items.append((body.spec, body.working_dir, digest))
        if problems:
            raise SpecError(problems)
        return [job_view(job) for job in service.submit_many(items, once=once)]

    @app.get("/v1/jobs", dependencies=auth)
    def list_jobs(
        limit: Limit = 50,
        state: str | None = None,
        label: Annotated[list[str] | None, Query()] = None,
        schedule: str | None = None,
    ) -> list[dict[str, Any]]:
        """Newest first; `state` (comma-separated), `label=K=V` (repeatable, all must hold)
        and `schedule` (its runs) narrow the list, as the dashboard's jobs page does."""
        from gpulayer.control.job_filters import check_states, parse_label_pairs, with_schedule

        states = check_states(state.split(","), "state") if state else None
        labels = with_schedule(parse_label_pairs(label or [], "label"), schedule, "schedule")
        jobs = service.list_jobs(states=states, labels=labels, limit=limit)
        return [job_view(j) for j in jobs]

    @app.post("/v1/jobs/delete", dependencies=auth)
    def delete_jobs(body: DeleteBody) -> list[dict[str, Any]]:
        return [job_view(j) for j in service.delete_jobs(body.jobs, dry_run=body.dry_run)]

    @app.post("/v1/jobs/prune", dependencies=auth)
    def prune_jobs(body: PruneBody) -> list[dict[str, Any]]:
        pruned = service.prune(older_than_seconds=body.older_than_seconds, dry_run=body.dry_run)
        return [job_view(j) for j in pruned]

    @app.get("/v1/arrays/{array_id}", dependencies=auth)
    def array(array_id: ArrayId) -> list[dict[str, Any]]:
        """A job array's jobs (submit --array), by index."""
        return [job_view(job) for job in service.array_jobs(array_id)]

    @app.post("/v1/arrays/{array_id}/cancel", dependencies=auth)
    def cancel_array(array_id: ArrayId) -> list[dict[str, Any]]:
        return [job_view(job) for job in service.cancel_array(array_id)]

    @app.get("/v1/jobs/{job_ref}", dependencies=auth)
    def get_job(job_ref: str) -> dict[str, Any]:
        return _job(service, service.resolve_job_id(job_ref))

    @app.post("/v1/jobs/{job_ref}/cancel", dependencies=auth)
    def cancel(job_ref: str) -> dict[str, Any]:
        job = service.cancel(job_ref)
        return _job(service, job.id)

    @app.get("/v1/jobs/{job_ref}/logs", dependencies=auth)
    def logs(
        job_ref: str, after: Cursor = 0, wait: WaitSeconds = 0, node: NodeRank = None
    ) -> dict[str, Any]:
        lines, job = service.read_logs(
            job_ref, after=after, wait=min(wait, _MAX_WAIT_SECONDS), node=node
        )
        return {
            "lines": [log_view(line) for line in lines],
            "job": job_view(job),
        }

    @app.get("/v1/jobs/{job_ref}/artifacts", dependencies=[checked])
    def artifacts(job_ref: str, who: Principal = Depends(caller)) -> list[dict[str, Any]]:
        service.check_artifact_access(service.resolve_job_id(job_ref), who)
        return service.artifacts(job_ref)

    @app.get("/v1/jobs/{job_ref}/artifacts/{path:path}", dependencies=[checked])
    def artifact(job_ref: str, path: str, who: Principal = Depends(caller)) -> FileResponse:
        service.check_artifact_access(service.resolve_job_id(job_ref), who)
        return FileResponse(service.artifact_path(job_ref, path))

    # --- workers ------------------------------------------------------------------------------

    @app.get("/v1/workers", dependencies=auth)
    def workers(all: bool = False) -> list[dict[str, Any]]:
        running = Counter(a.worker_id for a in service.store.active_attempts())
        return [
            worker_view(w, running=running[w.id])
            for w in service.list_workers()
            if all or w.state != "gone"
        ]

    @app.post("/v1/workers", dependencies=[checked])
    def register(registration: Registration, who: Principal = Depends(caller)) -> dict[str, Any]:
        worker, credential = service.register_worker(registration, who)
        return {"worker_id": worker.id, "epoch": worker.epoch, "token": credential}

    @app.post("/v1/workers/{worker_id}/heartbeat", dependencies=[checked])
    def heartbeat(
        worker_id: str, body: Heartbeat | None = None, who: Principal = Depends(caller)
    ) -> dict[str, Any]:
        running = body.running if body is not None else []
        degraded = body.degraded if body is not None else None
        return service.heartbeat(
            worker_id, running=running, caller=who, degraded=degraded
        ).model_dump()

    @app.post("/v1/workers/{worker_id}/claim", dependencies=[checked])
    async def claim(
        worker_id: str,
        wait: WaitSeconds = 0,
        signals: bool = False,
        who: Principal = Depends(caller),
    ) -> list[dict[str, Any]] | dict[str, Any]:
        reply = await claim_long_poll(
            service, worker_id, min(wait, _MAX_WAIT_SECONDS), who, with_cancels=signals
        )
        # Without signals=1 the reply is the bare list of assignments older workers read.
        if not signals:
            return [a.model_dump() for a in reply.assignments]
        return reply.model_dump()

    # Not `checked`: a job's output is repaired rather than refused (service.append_logs).
    @app.post("/v1/attempts/{attempt_id}/logs")
    def attempt_logs(
        attempt_id: RowId, batch: LogBatch, who: Principal = Depends(caller)
    ) -> dict[str, Any]:
        service.append_logs(attempt_id, batch.lines, who)
        return {"ok": True}

    # Checked here but for its logs, which are repaired like any of the job's output.
    @app.post("/v1/attempts/{attempt_id}/finish")
    def finish(
        attempt_id: RowId, report: AttemptReport, who: Principal = Depends(caller)
    ) -> dict[str, Any]:
        problems = unsafe_text(report.model_dump(mode="json", exclude={"logs"}))
        if problems:
            raise SpecError(problems)
        service.finish_attempt(attempt_id, report, who)
        return {"ok": True}

    # Logs are repaired like any of the job's output; the rest of each report is checked, and
    # a report that fails the check is refused alone, not with the batch it came in.
    @app.post("/v1/workers/{worker_id}/finish")
    def finish_many(
        worker_id: str, batch: FinishBatch, who: Principal = Depends(caller)
    ) -> dict[str, Any]:
        refused: dict[int, FinishOutcome] = {}
        storable: list[tuple[int, AttemptReport]] = []
        for index, item in enumerate(batch.reports):
            problems = unsafe_text(item.report.model_dump(mode="json", exclude={"logs"}))
            if problems:
                refused[index] = FinishOutcome(
                    attempt_id=item.attempt_id, outcome="refused", detail="; ".join(problems)
                )
            else:
                storable.append((item.attempt_id, item.report))
        recorded = iter(service.finish_attempts(worker_id, storable, who))
        results = [refused.get(i) or next(recorded) for i in range(len(batch.reports))]
        return FinishReply(results=results).model_dump()

    @app.get("/v1/jobs/{job_id}/bundle", dependencies=[checked])
    def bundle(job_id: str, who: Principal = Depends(caller)) -> FileResponse:
        resolved = service.resolve_job_id(job_id)
        service.check_job_access(resolved, who)
        return FileResponse(service.bundle_path(resolved))

    @app.put("/v1/attempts/{attempt_id}/outputs", openapi_extra=_ARCHIVE_BODY)
    async def upload_outputs(
        attempt_id: RowId, request: Request, who: Principal = Depends(caller)
    ) -> dict[str, Any]:
        await asyncio.to_thread(service.own_attempt, attempt_id, who)
        limits = service.output_limits
        # Unpacked while it streams in: a refusal is answered before the rest is read.
        await read_body_on_a_thread(
            request.stream(),
            lambda upload: service.receive_outputs(attempt_id, upload, who),
            on_received=lambda received: receive_within(received, limits),
        )
        return {"ok": True}

    @app.get("/v1/tokens", dependencies=auth)
    def list_tokens(all_kinds: bool = False) -> list[dict[str, Any]]:
        kinds = None if all_kinds else ["admin", "join"]
        return [token_view(record) for record in service.store.list_tokens(kinds=kinds)]

    @app.post("/v1/tokens/{token_id}/revoke", dependencies=auth)
    def revoke_token(token_id: str) -> dict[str, Any]:
        service.store.get_token(token_id)
        return {"id": token_id, "revoked": service.store.revoke_token(token_id)}

    @app.post("/v1/tokens", dependencies=auth)
    def create_token(
        body: TokenRequest, once: OnceKey | None = Depends(once_key)
    ) -> dict[str, Any]:
        made = answers.prior(once)
        if made is None:
            try:
                token = service.create_token(
                    body.kind,
                    body.name,
                    expires_at=body.expires_at,
                    max_workers=body.max_workers,
                    once=once,
                )
            except KeyTaken:
                made = answers.prior(once)
                if made is None:
                    raise
            else:
                return {"token": token, "kind": body.kind}
        # A token's value is shown once and never kept, so a resent request cannot be
        # answered with it: it is told which token its first send made instead.
        raise TokenShownOnce(
            f"{IDEMPOTENCY_HEADER}: this request made token {made[0]} already, whose value "
            f"is shown only once; revoke it (gpulayer token revoke {made[0]}) and create another"
        )

    @app.get("/v1/cost", dependencies=auth)
    def cost(job: str | None = None) -> dict[str, Any]:
        job_id = service.resolve_job_id(job) if job else None
        return cost_view(service.store.list_instances(job_id=job_id))

    @app.get("/v1/instances", dependencies=auth)
    def instances(all: bool = False, job: str | None = None) -> list[dict[str, Any]]:
        job_id = service.resolve_job_id(job) if job else None
        return _instances(service, job_id=job_id, live_only=not all and job_id is None)

    @app.post("/v1/offers", dependencies=auth)
    def offers(body: dict[str, Any]) -> dict[str, Any]:
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
        return list_offers(
            service.layout.root,
            spec,
            gpu_count_exact=body.get("gpu_count_exact") is not False,
            include_disabled=body.get("include_disabled") is not False,
            limit=limit,
            names=names,
        )

    @app.post("/v1/plan", dependencies=auth)
    def plan(body: dict[str, Any]) -> dict[str, Any]:
        spec = body.get("spec")
        if not isinstance(spec, dict):
            raise UsageError("spec: a job spec (an object)")
        working_dir = body.get("working_dir")
        if working_dir is not None and not isinstance(working_dir, str):
            raise UsageError("working_dir: a path (a string)")
        # As for a submit: only the local control plane reads this machine's folders.
        return service.plan(spec, working_dir=working_dir if embedded else None)

    @app.post("/v1/reap", dependencies=auth)
    def reap(dry_run: bool = False) -> list[dict[str, Any]]:
        if service.provisioner is None:
            return []
        return list(service.provisioner.reap(dry_run=dry_run))

    from gpulayer.control.schedule_api import add_schedule_routes

    add_schedule_routes(app, service, auth, embedded=embedded, answers=answers, once_key=once_key)

    @app.put("/v1/bundles", dependencies=auth, openapi_extra=_ARCHIVE_BODY)
    async def upload_bundle(request: Request) -> dict[str, Any]:
        from gpulayer.protocol.bundle import check_archive

        out = await _receive_file(service, request)
        try:
            await asyncio.to_thread(check_archive, out)
        except Exception:
            out.unlink(missing_ok=True)  # refused whole: nothing is kept of it
            raise
        digest = await asyncio.to_thread(service.bundles.keep, out)
        return {"bundle_id": f"{DIGEST_PREFIX}{digest}"}

    @app.get("/v1/bundles/{bundle_id}", dependencies=auth)
    def find_bundle(bundle_id: str) -> dict[str, Any]:
        """Whether the server keeps this bundle already (so a submit need not upload it)."""
        digest = parse_digest(bundle_id)
        if digest is None or not service.bundles.has(digest):
            raise NotFoundError(f"bundle {bundle_id} is not kept here")
        return {"bundle_id": f"{DIGEST_PREFIX}{digest}"}

    if extra_routes is not None:
        extra_routes(app, auth)

    from gpulayer.control.ui import mount_ui

    ui_session = mount_ui(app, service, authenticate)
    app.add_middleware(
        RequestEdge,
        authenticate=authenticate,
        caps=route_caps(service.output_limits.max_bytes),
        ui_session=ui_session,
        progress=service.progress,
    )
    return app


async def _receive_file(service: ControlService, request: Request) -> Path:
    return await receive_to_file(request.stream(), service.layout.root / "incoming", ".tar.gz")


def _field_line(error: Any) -> str:
    where = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
    return f"{where or 'request'}: {error.get('msg', 'invalid')}"


def _install_error_handlers(app: FastAPI) -> None:
    """One strategy for every route: the caller's mistakes are 4xx naming the field; only a
    fault of the control plane itself is a 500, logged here and answered in one line."""

    def refused(errors: list[Any], status: int = 422) -> JSONResponse:
        lines = [_field_line(e) for e in errors] or ["request: invalid"]
        detail = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "")} for e in errors]
        return SafeJSONResponse(
            {"error": "; ".join(lines), "detail": repaired(detail)}, status_code=status
        )

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return refused(list(exc.errors()))

    @app.exception_handler(ValidationError)
    async def _model_invalid(_request: Request, exc: ValidationError) -> JSONResponse:
        return refused(list(exc.errors()))

    @app.exception_handler(GpulayerError)
    async def _typed_error(_request: Request, exc: GpulayerError) -> JSONResponse:
        if isinstance(exc, SpecError):
            return SafeJSONResponse({"error": str(exc), "errors": exc.lines}, status_code=422)
        status = next((code for kind, code in _STATUS.items() if isinstance(exc, kind)), 500)
        return SafeJSONResponse({"error": str(exc), "kind": type(exc).__name__}, status_code=status)

    @app.exception_handler(OverflowError)
    async def _overflow(_request: Request, exc: OverflowError) -> JSONResponse:
        return SafeJSONResponse({"error": f"a number is out of range: {exc}"}, status_code=400)

    @app.exception_handler(RecursionError)
    async def _too_deep(_request: Request, _exc: RecursionError) -> JSONResponse:
        return SafeJSONResponse({"error": "request: nested too deeply"}, status_code=400)

    from sqlalchemy.exc import DataError

    @app.exception_handler(DataError)
    async def _out_of_range(_request: Request, exc: DataError) -> JSONResponse:
        # A value the database's column types refuse: the caller's, as the store says.
        first = str(exc.orig).strip().splitlines()[0] if exc.orig else "invalid value"
        return SafeJSONResponse(
            {"error": f"a value is out of range for the store: {first}"}, status_code=400
        )

    @app.exception_handler(Exception)
    async def _fault(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return SafeJSONResponse({"error": f"internal error: {type(exc).__name__}"}, status_code=500)


class _Unauthorized(Exception):
    pass


def _instances(
    service: ControlService, *, job_id: str | None, live_only: bool
) -> list[dict[str, Any]]:
    import time

    now = time.time()
    return [
        lifecycle_view(r, service.store.instance_history(r.request_id), now)
        for r in service.store.list_instances(job_id=job_id, live_only=live_only)
    ]


def _job(service: ControlService, job_id: str) -> dict[str, Any]:
    job = service.store.get_job(job_id)
    attempts = service.attempts(job_id)
    workers = {w.id: w for w in service.list_workers()}
    view = job_view(job, attempts, workers)
    spans = service.store.setup_spans(job_id, SETUP_LOG_PREFIX)
    for attempt in view["attempts"]:
        if attempt["number"] in spans:
            start, end = spans[attempt["number"]]
            attempt["setup_seconds"] = round(end - start, 3)
    instances = service.store.list_instances(job_id=job_id)
    if instances:
        view["cost"] = cost_view(instances)
        view["instances"] = _instances(service, job_id=job_id, live_only=False)
    if job.state == "queued":
        view["waiting_for"] = service.waiting_reasons(job)
    return view
