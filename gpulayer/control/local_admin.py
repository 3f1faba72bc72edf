"""The local control plane's own routes: status, stop (waiting for live jobs, or cancelling
them) and the GPULAYER_* variables a command sends for the next job.

Only the embedded daemon has them; a team server is run and stopped by its operator.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from gpulayer.control.environment import NEXT_JOB_VARIABLES
from gpulayer.control.service import ControlService
from gpulayer.control.store import LIVE_STATES
from gpulayer.errors import ControlPlaneError, UsageError

log = logging.getLogger("gpulayer.daemon")

FORCE_CANCEL_WAIT_SECONDS = 120.0
"""How long a forced stop waits for cancelled jobs to end (cloud teardown included)."""


class LocalAdmin:
    def __init__(
        self,
        service: ControlService,
        *,
        info: dict[str, Any],
        idle_seconds: float,
        request_exit: Callable[[], None],
        write_info: Callable[[dict[str, Any]], None],
        in_flight: Callable[[], list[str]] = list,
    ) -> None:
        self.service = service
        self._in_flight = in_flight
        """Work that outlives a job's end (a cloud teardown, a local attempt winding down): a
        stop without force waits for it too, or it would leave a bill or a key behind."""
        self.info = info
        self.idle_seconds = idle_seconds
        self._request_exit = request_exit
        self._write_info = write_info
        self._lock = threading.Lock()
        self.closing = False

    def live_job_ids(self) -> list[str]:
        return [job.id for job in self.service.store.list_jobs(states=LIVE_STATES, limit=1000)]

    def status(self) -> dict[str, Any]:
        return {
            **self.info,
            "live_jobs": self.live_job_ids(),
            "in_flight": self._in_flight(),
            "idle_seconds": self.idle_seconds,
            "idle_for": round(time.monotonic() - self.service.last_call, 1),
            "closing": self.closing,
        }

    def stop(self, *, force: bool) -> dict[str, Any]:
        """Exit now when no job is live; with force, cancel the live jobs first. Otherwise
        answer which jobs are live and keep running."""
        with self._lock:
            self.closing = True  # refuse new jobs while deciding, so none slips in
            live = self.live_job_ids()
            busy = self._in_flight()
            if (live or busy) and not force:
                self.closing = False
                return {"stopping": False, "live_jobs": live, "in_flight": busy}
        if live or busy:
            threading.Thread(
                target=self._cancel_then_exit, args=(live,), name="gpulayer-stop", daemon=True
            ).start()
        else:
            log.info("stopping on request")
            self._request_exit()
        return {"stopping": True, "cancelled": live}

    def _cancel_then_exit(self, live: list[str]) -> None:
        for job_id in live:
            try:
                self.service.jobs.cancel(job_id)
            except Exception:
                log.exception("cancelling %s for a forced stop failed", job_id)
        deadline = time.monotonic() + FORCE_CANCEL_WAIT_SECONDS
        while (self.service.jobs.live_jobs() or self._in_flight()) and time.monotonic() < deadline:
            self.service.changes.wait_for_change(self.service.changes.version, 0.5)
        log.info("stopping on request after cancelling %d job(s)", len(live))
        self._request_exit()

    def set_environment(self, values: dict[str, Any]) -> dict[str, Any]:
        """Take the shell's values of the variables read per job (None unsets one)."""
        unknown = sorted(set(values) - NEXT_JOB_VARIABLES)
        if unknown:
            raise UsageError(f"{unknown[0]}: not a variable the control plane takes while running")
        for name, value in values.items():
            if value is not None and not isinstance(value, str):
                raise UsageError(f"{name}: a string or null, not {value!r}")
        with self._lock:
            for name, value in values.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            self.info["env"] = {**self.info.get("env", {}), **values}
            self._write_info(self.info)
        log.info("environment for the next jobs: %s", ", ".join(sorted(values)))
        return {"env": self.info["env"]}


def add_local_routes(app: Any, admin: LocalAdmin, auth: list[Any]) -> None:
    from fastapi import Request
    from fastapi.responses import JSONResponse

    @app.middleware("http")
    async def refuse_jobs_while_closing(request: Request, call_next: Any) -> Any:
        if admin.closing and request.method == "POST" and request.url.path == "/v1/jobs":
            error = ControlPlaneError("the local control plane is stopping; submit again")
            return JSONResponse({"error": str(error), "kind": "ControlPlaneError"}, status_code=503)
        return await call_next(request)

    @app.get("/v1/local", dependencies=auth)
    def local_status() -> dict[str, Any]:
        return admin.status()

    @app.post("/v1/local/stop", dependencies=auth)
    def local_stop(body: dict[str, Any]) -> dict[str, Any]:
        return admin.stop(force=bool(body.get("force")))

    @app.post("/v1/local/environment", dependencies=auth)
    def local_environment(body: dict[str, Any]) -> dict[str, Any]:
        values = body.get("env")
        if not isinstance(values, dict):
            raise UsageError("env: a mapping of variable names to values is required")
        return admin.set_environment(values)
