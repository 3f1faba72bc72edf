"""The worker agent: takes assignments from a control plane, runs them, reports back.

The same agent serves the embedded local worker (over an in-process link) and remote workers
(over HTTP); only the ControlLink differs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from gpulayer.control.protocol import Assignment, AttemptReport, HeartbeatReply, Registration
from gpulayer.worker.logship import LogShipper

log = logging.getLogger("gpulayer.worker")


class ControlLink(Protocol):
    def register(self, registration: Registration) -> str: ...
    def heartbeat(self, worker_id: str, running: list[int]) -> HeartbeatReply: ...
    def claim(self, worker_id: str, wait: float) -> list[Assignment]: ...
    def append_logs(self, attempt_id: int, lines: list[tuple[str, str]]) -> None: ...
    def finish(self, attempt_id: int, report: AttemptReport) -> None: ...
    def fetch_bundle(self, job_id: str, destination: Path) -> None: ...
    def store_outputs(self, job_id: str, output_dir: Path) -> None: ...
    def resolve_artifact(self, reference: str, scratch: Path) -> Path: ...
    def job_environment(self, job_id: str) -> Mapping[str, str] | None: ...


class WorkerAgent:
    def __init__(
        self,
        link: ControlLink,
        registration: Registration,
        *,
        work_root: Path,
        heartbeat_seconds: float = 5.0,
        claim_wait_seconds: float = 10.0,
        on_contact: Callable[[], None] | None = None,
    ) -> None:
        self.link = link
        self.registration = registration
        self.work_root = work_root
        self.heartbeat_seconds = heartbeat_seconds
        self.claim_wait_seconds = claim_wait_seconds
        self.worker_id: str | None = None
        self._on_contact = on_contact or (lambda: None)
        self._runs: dict[int, object] = {}
        self._runs_lock = threading.Lock()
        self._stop = threading.Event()
        self._abandon = threading.Event()
        self._cancel_requested: set[int] = set()
        self._job_threads: list[threading.Thread] = []
        self._threads: list[threading.Thread] = []

    def start(self) -> str:
        self.worker_id = self.link.register(self.registration)
        for target, name in ((self._claim_loop, "claim"), (self._heartbeat_loop, "heartbeat")):
            thread = threading.Thread(target=target, name=f"gpulayer-worker-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self.worker_id

    def stop(self, *, cancel_running: bool = True) -> None:
        """Stop taking work; running attempts are ended and reported as lost (so they retry)."""
        self._stop.set()
        if cancel_running:
            with self._runs_lock:
                runs = list(self._runs.values())
            for run in runs:
                run.cancel()  # type: ignore[attr-defined]

    def drain(self, timeout: float) -> None:
        """Wait for ending attempts to report, then give up on those still trying."""
        import time

        deadline = time.monotonic() + timeout
        for thread in list(self._job_threads):
            thread.join(max(0.0, deadline - time.monotonic()))
        self._abandon.set()

    @property
    def running(self) -> int:
        with self._runs_lock:
            return len(self._runs)

    def _claim_loop(self) -> None:
        assert self.worker_id is not None
        while not self._stop.is_set():
            try:
                assignments = self.link.claim(self.worker_id, self.claim_wait_seconds)
                self._on_contact()
                for assignment in assignments:
                    thread = threading.Thread(
                        target=self._run_assignment,
                        args=(assignment,),
                        name=f"gpulayer-job-{assignment.job_id}",
                        daemon=True,
                    )
                    thread.start()
                    self._job_threads.append(thread)
                self._job_threads = [t for t in self._job_threads if t.is_alive()]
            except Exception:  # a control plane hiccup must not end the worker
                log.exception("claiming work failed; retrying")
                self._stop.wait(1.0)

    def _heartbeat_loop(self) -> None:
        assert self.worker_id is not None
        while not self._stop.wait(self.heartbeat_seconds):
            with self._runs_lock:
                running = list(self._runs)
            try:
                self.apply_signals(self.link.heartbeat(self.worker_id, running))
                self._on_contact()
            except Exception:
                log.exception("heartbeat failed")

    def apply_signals(self, reply: HeartbeatReply) -> None:
        self._cancel_requested.update(reply.cancel_attempts)
        with self._runs_lock:
            targets = [self._runs.get(a) for a in [*reply.cancel_attempts, *reply.fenced_attempts]]
        for run in targets:
            if run is not None:
                run.cancel()  # type: ignore[attr-defined]

    def _run_assignment(self, assignment: Assignment) -> None:
        from gpulayer.spec import JobSpec
        from gpulayer.worker.runner import JobRun, RunContext

        attempt_dir = self.work_root / assignment.job_id / f"attempt-{assignment.attempt}"
        attempt_dir.mkdir(parents=True, exist_ok=True)
        shipper = LogShipper(lambda lines: self.link.append_logs(assignment.attempt_id, lines))
        shipper.start()
        report: AttemptReport
        try:
            spec = JobSpec.model_validate(assignment.spec)
            bundle = None
            if assignment.has_bundle:
                bundle = attempt_dir / "source.tar.gz"
                self.link.fetch_bundle(assignment.job_id, bundle)
            context = RunContext(
                job_id=assignment.job_id,
                attempt=assignment.attempt,
                spec=spec,
                job_dir=attempt_dir,
                bundle=bundle,
                source_dir=Path(assignment.working_dir) if assignment.working_dir else None,
                resolve_artifact=lambda ref: self.link.resolve_artifact(
                    ref, attempt_dir / "fetched"
                ),
                extra_env=_device_env(spec.resources.accelerator, assignment.gpu_indices),
                worker_env=self.link.job_environment(assignment.job_id),
            )
            run = JobRun(context, on_log=shipper.add)
            with self._runs_lock:
                self._runs[assignment.attempt_id] = run
            outcome = run.run()
            shipper.flush()
            self._persist(
                f"storing outputs of attempt {assignment.attempt_id}",
                lambda: self.link.store_outputs(assignment.job_id, outcome.output_dir),
            )
            report = AttemptReport(
                state=outcome.state,
                reason=outcome.reason,
                exit_code=outcome.exit_code,
                result=outcome.result,
                message=outcome.message,
            )
        except Exception as exc:  # the job fails with a reason; the worker lives on
            log.exception("attempt %s failed to run", assignment.attempt_id)
            shipper.add("system", f"worker error: {type(exc).__name__}: {exc}")
            report = AttemptReport(state="failed", reason="worker_error", message=str(exc))
        finally:
            with self._runs_lock:
                self._runs.pop(assignment.attempt_id, None)
            shipper.close()
        if self._stop.is_set() and report.state == "cancelled" and not self._cancelled(assignment):
            # The worker is shutting down: the job did not choose to end, so it may retry.
            report = AttemptReport(
                state="failed", reason="worker_lost", message="the worker stopped"
            )
        self._report(assignment.attempt_id, report)

    def _cancelled(self, assignment: Assignment) -> bool:
        return assignment.attempt_id in self._cancel_requested

    def _report(self, attempt_id: int, report: AttemptReport) -> None:
        self._persist(
            f"reporting attempt {attempt_id}", lambda: self.link.finish(attempt_id, report)
        )

    def _persist(self, what: str, call: Callable[[], None]) -> None:
        """Retry a call until it lands, waiting out a control plane that is away (restarting)."""
        delay = 0.2
        while True:
            try:
                call()
                return
            except Exception as exc:
                log.warning("%s failed (%s); retrying in %.1f s", what, exc, delay)
                if self._abandon.wait(delay):
                    return
                delay = min(delay * 2, 10.0)


def _device_env(accelerator: str, gpu_indices: list[int]) -> dict[str, str]:
    """Give a job exactly its GPUs, and none to a job that asked for none."""
    visible = ",".join(str(i) for i in gpu_indices)
    if accelerator == "rocm":
        return {"ROCR_VISIBLE_DEVICES": visible, "HIP_VISIBLE_DEVICES": visible}
    if accelerator == "mps":
        return {}
    return {"CUDA_VISIBLE_DEVICES": visible}
