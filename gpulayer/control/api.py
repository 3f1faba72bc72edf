"""The control plane's HTTP API (FastAPI). Thin: parse, call the service, shape the answer."""

from __future__ import annotations

import hmac
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse

from gpulayer import __version__
from gpulayer.control.auth import LOCAL_ADMIN, Principal
from gpulayer.control.protocol import (
    AttemptReport,
    Heartbeat,
    LogBatch,
    Registration,
    TokenRequest,
)
from gpulayer.control.service import ControlService
from gpulayer.control.views import cost_view, job_view, log_view, token_view, worker_view
from gpulayer.errors import (
    ForbiddenError,
    GpulayerError,
    NotFoundError,
    SpecError,
    StaleAttemptError,
    UsageError,
)

_MAX_WAIT_SECONDS = 30.0
_STATUS: dict[type[GpulayerError], int] = {
    NotFoundError: 404,
    ForbiddenError: 403,
    StaleAttemptError: 409,
    UsageError: 400,
}


Authenticator = Callable[[str], "Principal | None"]
"""Maps a bearer token to its principal, or None when unknown, revoked or expired."""


def single_token(token: str) -> Authenticator:
    expected = token.encode()
    return lambda given: LOCAL_ADMIN if hmac.compare_digest(given.encode(), expected) else None


def create_app(
    service: ControlService, authenticate: Authenticator, *, embedded: bool = False
) -> FastAPI:
    app = FastAPI(
        title="gpulayer control plane", version=__version__, docs_url=None, redoc_url=None
    )

    def caller(request: Request) -> Principal:
        service.touch()
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        principal = authenticate(given) if scheme.lower() == "bearer" and given else None
        if principal is None:
            raise _Unauthorized("missing, wrong, revoked or expired token")
        return principal

    def admin_only(request: Request) -> None:
        if caller(request).kind != "admin":
            raise _Unauthorized("this token may only run a worker")

    @app.exception_handler(_Unauthorized)
    async def _unauthorized(_request: Request, exc: _Unauthorized) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=401)

    @app.exception_handler(GpulayerError)
    async def _typed_error(_request: Request, exc: GpulayerError) -> JSONResponse:
        if isinstance(exc, SpecError):
            return JSONResponse({"error": str(exc), "errors": exc.lines}, status_code=422)
        status = next((code for kind, code in _STATUS.items() if isinstance(exc, kind)), 500)
        return JSONResponse({"error": str(exc), "kind": type(exc).__name__}, status_code=status)

    auth = [Depends(admin_only)]

    @app.get("/v1/health")
    def health() -> dict[str, Any]:
        import os

        return {"ok": True, "version": __version__, "embedded": embedded, "pid": os.getpid()}

    # --- jobs ---------------------------------------------------------------------------------

    @app.post("/v1/jobs", dependencies=auth, status_code=201)
    def submit(body: dict[str, Any]) -> dict[str, Any]:
        spec = body.get("spec")
        if not isinstance(spec, dict):
            raise UsageError("spec: a JobSpec object is required")
        bundle = _incoming_bundle(service, body.get("bundle_id"))
        source_dir = body.get("source_dir")
        if source_dir is not None and not embedded:
            raise UsageError("source_dir: only the local control plane reads local directories")
        client_env = body.get("client_env")
        if not embedded or not isinstance(client_env, dict):
            client_env = None
        job = service.submit(
            spec,
            working_dir=body.get("working_dir"),
            bundle=bundle,
            source_dir=Path(source_dir) if source_dir else None,
            client_env=client_env,
        )
        return _job(service, job.id)

    @app.get("/v1/jobs", dependencies=auth)
    def list_jobs(limit: int = 50, state: str | None = None) -> list[dict[str, Any]]:
        states = state.split(",") if state else None
        return [job_view(j) for j in service.list_jobs(states=states, limit=limit)]

    @app.get("/v1/jobs/{job_ref}", dependencies=auth)
    def get_job(job_ref: str) -> dict[str, Any]:
        return _job(service, service.resolve_job_id(job_ref))

    @app.post("/v1/jobs/{job_ref}/cancel", dependencies=auth)
    def cancel(job_ref: str) -> dict[str, Any]:
        job = service.cancel(job_ref)
        return _job(service, job.id)

    @app.get("/v1/jobs/{job_ref}/logs", dependencies=auth)
    def logs(job_ref: str, after: int = 0, wait: float = 0) -> dict[str, Any]:
        lines, job = service.read_logs(job_ref, after=after, wait=min(wait, _MAX_WAIT_SECONDS))
        return {
            "lines": [log_view(line) for line in lines],
            "job": job_view(job),
        }

    @app.get("/v1/jobs/{job_ref}/artifacts")
    def artifacts(job_ref: str, who: Principal = Depends(caller)) -> list[dict[str, Any]]:
        service.check_artifact_access(service.resolve_job_id(job_ref), who)
        return service.artifacts(job_ref)

    @app.get("/v1/jobs/{job_ref}/artifacts/{path:path}")
    def artifact(job_ref: str, path: str, who: Principal = Depends(caller)) -> FileResponse:
        service.check_artifact_access(service.resolve_job_id(job_ref), who)
        return FileResponse(service.artifact_path(job_ref, path))

    # --- workers ------------------------------------------------------------------------------

    @app.get("/v1/workers", dependencies=auth)
    def workers() -> list[dict[str, Any]]:
        running = Counter(a.worker_id for a in service.store.active_attempts())
        return [worker_view(w, running=running[w.id]) for w in service.list_workers()]

    @app.post("/v1/workers")
    def register(registration: Registration, who: Principal = Depends(caller)) -> dict[str, Any]:
        worker, credential = service.register_worker(registration, who)
        return {"worker_id": worker.id, "epoch": worker.epoch, "token": credential}

    @app.post("/v1/workers/{worker_id}/heartbeat")
    def heartbeat(
        worker_id: str, body: Heartbeat | None = None, who: Principal = Depends(caller)
    ) -> dict[str, Any]:
        running = body.running if body is not None else []
        return service.heartbeat(worker_id, running=running, caller=who).model_dump()

    @app.post("/v1/workers/{worker_id}/claim")
    def claim(
        worker_id: str, wait: float = 0, who: Principal = Depends(caller)
    ) -> list[dict[str, Any]]:
        since = service.version
        found = service.claim(worker_id, who)
        if not found and wait > 0:
            service.wait_for_change(since, min(wait, _MAX_WAIT_SECONDS))
            found = service.claim(worker_id, who)
        return [a.model_dump() for a in found]

    @app.post("/v1/attempts/{attempt_id}/logs")
    def attempt_logs(
        attempt_id: int, batch: LogBatch, who: Principal = Depends(caller)
    ) -> dict[str, Any]:
        service.append_logs(attempt_id, batch.lines, who)
        return {"ok": True}

    @app.post("/v1/attempts/{attempt_id}/finish")
    def finish(
        attempt_id: int, report: AttemptReport, who: Principal = Depends(caller)
    ) -> dict[str, Any]:
        service.finish_attempt(attempt_id, report, who)
        return {"ok": True}

    @app.get("/v1/jobs/{job_id}/bundle")
    def bundle(job_id: str, who: Principal = Depends(caller)) -> FileResponse:
        resolved = service.resolve_job_id(job_id)
        service.check_job_access(resolved, who)
        path = service.layout.bundle_file(resolved)
        if not path.exists():
            raise NotFoundError(f"job {job_id} has no source bundle")
        return FileResponse(path)

    @app.put("/v1/attempts/{attempt_id}/outputs")
    async def upload_outputs(
        attempt_id: int, request: Request, who: Principal = Depends(caller)
    ) -> dict[str, Any]:
        import asyncio

        await asyncio.to_thread(service.own_attempt, attempt_id, who)
        incoming = service.layout.root / "incoming"
        incoming.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=incoming, suffix=".tar.gz", delete=False) as out:
            async for chunk in request.stream():
                out.write(chunk)
        try:
            await asyncio.to_thread(
                service.record_output_archive, attempt_id, Path(out.name), who
            )
        finally:
            Path(out.name).unlink(missing_ok=True)
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
    def create_token(body: TokenRequest) -> dict[str, Any]:
        token = service.create_token(
            body.kind, body.name, expires_at=body.expires_at, max_workers=body.max_workers
        )
        return {"token": token, "kind": body.kind}

    @app.get("/v1/cost", dependencies=auth)
    def cost(job: str | None = None) -> dict[str, Any]:
        job_id = service.resolve_job_id(job) if job else None
        return cost_view(service.store.list_instances(job_id=job_id))

    @app.post("/v1/offers", dependencies=auth)
    def offers(body: dict[str, Any]) -> dict[str, Any]:
        from gpulayer.cloud.search import list_offers
        from gpulayer.spec.validate import validate_spec

        limit = body.get("limit", 30)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise UsageError("limit: a whole number, 0 or more")
        spec = validate_spec(body.get("spec") or {})
        return list_offers(
            service.layout.root,
            spec,
            gpu_count_exact=body.get("gpu_count_exact") is not False,
            include_disabled=body.get("include_disabled") is not False,
            limit=limit,
        )

    @app.post("/v1/reap", dependencies=auth)
    def reap(dry_run: bool = False) -> list[dict[str, Any]]:
        if service.provisioner is None:
            return []
        return list(service.provisioner.reap(dry_run=dry_run))

    from gpulayer.control.schedule_api import add_schedule_routes

    add_schedule_routes(app, service, auth, embedded=embedded)

    @app.put("/v1/bundles", dependencies=auth)
    async def upload_bundle(request: Request) -> dict[str, Any]:
        incoming = service.layout.root / "incoming"
        incoming.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=incoming, suffix=".tar.gz", delete=False) as out:
            async for chunk in request.stream():
                out.write(chunk)
        return {"bundle_id": Path(out.name).name}

    from gpulayer.control.ui import mount_ui

    mount_ui(app, service, authenticate)
    return app


class _Unauthorized(Exception):
    pass


def _incoming_bundle(service: ControlService, bundle_id: Any) -> Path | None:
    if bundle_id is None:
        return None
    if not isinstance(bundle_id, str) or "/" in bundle_id or not bundle_id.endswith(".tar.gz"):
        raise UsageError("bundle_id: not a bundle this server handed out")
    path = service.layout.root / "incoming" / bundle_id
    if not path.is_file():
        raise UsageError(f"bundle_id: {bundle_id} was not uploaded (or was used already)")
    return path


def _job(service: ControlService, job_id: str) -> dict[str, Any]:
    job = service.store.get_job(job_id)
    attempts = service.attempts(job_id)
    workers = {w.id: w for w in service.list_workers()}
    view = job_view(job, attempts, workers)
    instances = service.store.list_instances(job_id=job_id)
    if instances:
        view["cost"] = cost_view(instances)
    if job.state == "queued":
        view["waiting_for"] = service.waiting_reasons(job)
    return view
