"""The control plane's service: jobs in, assignments out, reports back.

One class serves the embedded local control plane and the team server alike; the HTTP API and
the in-process local worker are two doors into it.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpulayer.control import gangs
from gpulayer.control.auth import Principal, PrincipalKind, issue_token
from gpulayer.control.ids import new_id
from gpulayer.control.job_states import ACTIVE_ATTEMPT_STATES, JobStates
from gpulayer.control.paths import HomeLayout
from gpulayer.control.store import (
    TERMINAL_STATES,
    AttemptRecord,
    JobRecord,
    LogLine,
    Store,
    WorkerRecord,
)
from gpulayer.control.targets import choose_target
from gpulayer.control.text_checks import repair_text, unsafe_text
from gpulayer.errors import (
    ForbiddenError,
    NotFoundError,
    SpecError,
    StaleAttemptError,
    UsageError,
)
from gpulayer.protocol.messages import Assignment, AttemptReport, HeartbeatReply, Registration
from gpulayer.spec import JobSpec
from gpulayer.spec.capabilities import WorkerCapabilities
from gpulayer.spec.validate import validate_spec

log = logging.getLogger("gpulayer.control")

_RETRYABLE_REASONS = frozenset({"worker_lost", "preempted"})


class ControlService:
    def __init__(
        self, store: Store, layout: HomeLayout, *, heartbeat_timeout: float = 30.0
    ) -> None:
        self.store = store
        self.states = JobStates(store)
        self.layout = layout
        self.heartbeat_timeout = heartbeat_timeout
        self._dispatch_lock = threading.Lock()
        self._changed = threading.Condition()
        self._version = 0
        self._listeners: list[Callable[[], None]] = []
        self.last_call = time.monotonic()
        self._started = time.time()
        self.cloud_available: Callable[[], bool] = lambda: False
        self.cloud_refusal: Callable[[JobSpec], str | None] = lambda spec: None
        """Why no offer could ever take a cloud gang, asked at submit; None: it may run."""
        self.provisioner: Any = None
        self.schedules: Any = None  # a ScheduleService, once attach_schedules ran
        # Workers whose silence is the control plane's own (their tunnel is being reopened).
        self.sweep_exempt: Callable[[], set[str]] = set
        # The submitting shell's environment for local jobs: memory only, never the store.
        self._client_env: dict[str, dict[str, str]] = {}
        self._outputs_lock = threading.Lock()
        from gpulayer.control.dispatch import LivePlacement

        # The dispatch pass's workers, kept between passes: told below of every change.
        self.placement = LivePlacement(store)

    # --- change notification ----------------------------------------------------------------

    def on_work(self, listener: Callable[[], None]) -> None:
        """Call listener whenever new assignments or cancellations may be waiting."""
        self._listeners.append(listener)

    def notify(self) -> None:
        with self._changed:
            self._version += 1
            self._changed.notify_all()
        for listener in self._listeners:
            listener()

    def wait_for_change(self, since: int, timeout: float) -> int:
        with self._changed:
            self._changed.wait_for(lambda: self._version != since, timeout=timeout)
            return self._version

    @property
    def version(self) -> int:
        return self._version

    def touch(self) -> None:
        self.last_call = time.monotonic()

    # --- jobs -------------------------------------------------------------------------------

    def submit(
        self,
        spec_data: dict[str, Any],
        *,
        working_dir: str | None = None,
        bundle: Path | None = None,
        source_dir: Path | None = None,
        client_env: dict[str, str] | None = None,
        warnings: list[str] | None = None,
    ) -> JobRecord:
        """Validate, choose a target, persist.

        `bundle` is an uploaded source tarball to keep for the job; `source_dir` a local
        directory to snapshot into one (what changed meanwhile is added to `warnings`).
        Nothing is kept when the spec does not validate.
        """
        try:
            problems = unsafe_text(spec_data)
            if problems:
                raise SpecError(problems)
            spec = validate_spec(spec_data)
        except Exception:
            if bundle is not None:
                bundle.unlink(missing_ok=True)
            raise
        # Checked only for jobs that may go to a cloud: it validates providers.yaml, whose
        # errors (ConfigError, exit 2) then refuse the job before anything is kept.
        cloud = "cloud" in spec.placement.targets and self.cloud_available()
        decision = choose_target(
            spec, self.worker_views(), cloud_available=cloud, cloud_refusal=self.cloud_refusal
        )
        job_id = new_id("j")
        destination = self.layout.bundle_file(job_id)
        if source_dir is not None:
            from gpulayer.protocol.bundle import bundle_warning, create_bundle

            destination.parent.mkdir(parents=True, exist_ok=True)
            try:
                info = create_bundle(source_dir, destination, exclude=[self.layout.root])
            except Exception:
                shutil.rmtree(destination.parent, ignore_errors=True)
                raise
            warning = bundle_warning(info)
            if warning and warnings is not None:
                warnings.append(warning)
        elif bundle is not None:
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(bundle), destination)
        job = self.store.insert_job(
            job_id=job_id,
            name=spec.name,
            spec=spec.model_dump(mode="json"),
            state="queued" if decision.target else "failed",
            target=decision.target or spec.placement.target,
            working_dir=working_dir,
            has_bundle=destination.exists(),
            labels=dict(spec.labels),
            reason=None if decision.target else "unschedulable",
            message=decision.message,
        )
        self.log_system(job.id, 0, decision.notes)
        if client_env is not None and decision.target == "local":
            self._client_env[job.id] = dict(client_env)
        if decision.target:
            self.dispatch()
        return self.store.get_job(job.id)

    def job_environment(self, job_id: str) -> dict[str, str] | None:
        """The environment a local job starts from, if its submitter handed one over."""
        return self._client_env.get(job_id)

    def _forget_environment(self, job_id: str) -> None:
        self._client_env.pop(job_id, None)

    def resolve_job_id(self, job_ref: str) -> str:
        try:
            return self.store.get_job(job_ref).id
        except NotFoundError:
            matches = self.store.find_job_ids(job_ref) if len(job_ref) >= 3 else []
            if len(matches) == 1:
                return matches[0]
            if len(matches) > 1:
                raise UsageError(
                    f"JOB: {job_ref!r} matches several jobs: {', '.join(matches)}"
                ) from None
            raise

    def get_job(self, job_ref: str) -> JobRecord:
        return self.store.get_job(self.resolve_job_id(job_ref))

    def list_jobs(self, *, states: Sequence[str] | None = None, limit: int = 50) -> list[JobRecord]:
        return self.store.list_jobs(states=states, limit=limit)

    def attempts(self, job_id: str) -> list[AttemptRecord]:
        return self.store.attempts_for(job_id)

    def cancel(self, job_ref: str) -> JobRecord:
        job = self.get_job(job_ref)
        if job.terminal:
            return job
        if self.states.move_job(
            job.id,
            "cancelled",
            only_from=["queued", "provisioning"],
            reason="cancelled",
            message="cancelled before it started",
        ):
            self.log_system(job.id, job.attempts, ["cancelled"])
            self._forget_environment(job.id)
        else:
            self.store.update_job(job.id, cancel_requested=True)
        self.notify()
        return self.store.get_job(job.id)

    def read_logs(
        self, job_ref: str, *, after: int = 0, wait: float = 0.0, node: int | None = None
    ) -> tuple[list[LogLine], JobRecord]:
        """Lines after the given id; with wait, block up to that long for news."""
        job_id = self.resolve_job_id(job_ref)
        deadline = time.monotonic() + wait
        while True:
            since = self.version
            job = self.store.get_job(job_id)
            lines = self.store.read_logs(job_id, after=after, node=node)
            remaining = deadline - time.monotonic()
            if lines or job.terminal or remaining <= 0:
                return lines, job
            self.wait_for_change(since, min(remaining, 1.0))

    def artifacts(self, job_ref: str) -> list[dict[str, Any]]:
        return self.store.list_artifacts(self.resolve_job_id(job_ref))

    def artifact_path(self, job_ref: str, path: str) -> Path:
        job_id = self.resolve_job_id(job_ref)
        root = self.layout.outputs_dir(job_id).resolve()
        target = (root / path).resolve()
        if not target.is_relative_to(root) or not target.exists():
            raise NotFoundError(f"job {job_id} has no output {path!r}")
        return target

    # --- deleting finished jobs ---------------------------------------------------------------

    def delete_jobs(self, job_refs: Sequence[str], *, dry_run: bool = False) -> list[JobRecord]:
        """Remove finished jobs: their rows (logs, attempts, artifacts, ledger) and files
        (outputs, bundle, attempt folders). All or nothing: a live job among them refuses
        the whole call before anything is removed."""
        jobs = [self.get_job(ref) for ref in dict.fromkeys(job_refs)]
        live = [j for j in jobs if not j.terminal]
        if live:
            listed = ", ".join(f"{j.id} is {j.state}" for j in live)
            raise UsageError(f"JOB: {listed}; cancel it first (nothing was deleted)")
        if dry_run:
            return jobs
        return [job for job in jobs if self._delete_finished(job)]

    def prune(self, *, older_than_seconds: float, dry_run: bool = False) -> list[JobRecord]:
        """Remove finished jobs that ended more than ``older_than_seconds`` ago."""
        ids = self.store.finished_job_ids(ended_before=time.time() - older_than_seconds)
        jobs = [self.store.get_job(job_id) for job_id in ids]
        if dry_run:
            return jobs
        return [job for job in jobs if self._delete_finished(job)]

    def _delete_finished(self, job: JobRecord) -> bool:
        if not self.store.delete_finished_job(job.id):
            return False  # a live cloud instance still bills to it: the reaper comes first
        # Rows first: a crash between the two leaves stray files, never rows without them.
        shutil.rmtree(self.layout.job_dir(job.id), ignore_errors=True)
        self._forget_environment(job.id)
        return True

    # --- workers ----------------------------------------------------------------------------

    def register_worker(
        self, registration: Registration, caller: Principal | None = None
    ) -> tuple[WorkerRecord, str | None]:
        """Add a worker (or a new epoch of one); returns it and, for a caller over the API, the
        credential bound to it. ``caller`` None is the control plane's own in-process worker."""
        if caller is not None:
            self._check_registration(registration, caller)
        capabilities = WorkerCapabilities.model_validate(registration.capabilities)
        worker_id = registration.worker_id or new_id("w")
        join_token = caller.token_id if caller is not None and caller.kind == "join" else None
        if join_token is not None and not self.store.count_registration(join_token):
            raise ForbiddenError("this join token has registered all the workers it may")
        worker = self.store.upsert_worker(
            worker_id=worker_id,
            name=registration.name,
            kind=registration.kind,
            labels=registration.labels,
            capabilities=capabilities.model_dump(mode="json"),
        )
        if registration.instance_request_id:
            # A cloud worker: it runs its instance's job, found by the reservation, not by name.
            self.store.bind_reservation(registration.instance_request_id, worker.id)
        credential = None
        if caller is not None and caller.kind != "worker":
            parent = caller.token_id if caller.kind == "join" else None
            credential, _ = issue_token(
                self.store, "worker", f"worker {worker.name}", worker_id=worker.id, parent_id=parent
            )
        if worker.epoch > 1:
            # Whatever it ran before it came back is gone with its old process.
            for attempt in self.store.active_attempts(worker.id):
                self._lose_attempt(attempt, "the worker restarted")
        self.placement.worker_changed(worker.id)
        self.dispatch()
        return worker, credential

    @staticmethod
    def _check_registration(registration: Registration, caller: Principal) -> None:
        if registration.kind == "local":
            raise ForbiddenError("kind: local is the control plane's own worker")
        if caller.kind == "worker":
            if registration.worker_id != caller.worker_id:
                raise ForbiddenError("a worker credential re-registers only its own worker")
        elif registration.worker_id is not None and caller.kind != "admin":
            raise ForbiddenError("worker_id: a join token registers new workers only")

    def list_workers(self) -> list[WorkerRecord]:
        return self.store.list_workers()

    def heartbeat(
        self, worker_id: str, running: Sequence[int] = (), caller: Principal | None = None
    ) -> HeartbeatReply:
        """Note the worker alive; settle what it runs against what the store says it runs.

        An attempt the worker reports but no longer owns is fenced (the worker ends it). An
        attempt the store has running there that the worker does not report, once it had a
        heartbeat timeout to show up (a claim whose reply was lost), is lost and retried."""
        self._check_worker(caller, worker_id)
        self.store.set_worker_state(worker_id, "ready", heartbeat=True)
        self.placement.worker_alive(worker_id)
        reply = self.pending_signals(worker_id)
        reported = set(running)
        active = self.store.active_attempts(worker_id)
        active_ids = {a.id for a in active}
        # Attempts given up on while it was silent may already run elsewhere: fence them.
        reply.fenced_attempts = [a for a in running if a not in active_ids]
        unreported_before = time.time() - self.heartbeat_timeout
        for attempt in active:
            if (
                attempt.state == "running"
                and attempt.id not in reported
                and (attempt.started_at or attempt.created_at) < unreported_before
            ):
                self._lose_attempt(attempt, f"worker {worker_id} does not report attempt running")
        return reply

    def pending_signals(self, worker_id: str) -> HeartbeatReply:
        reply = HeartbeatReply()
        for attempt in self.store.active_attempts(worker_id):
            job = self.store.get_job(attempt.job_id)
            if job.cancel_requested:
                reply.cancel_attempts.append(attempt.id)
        return reply

    def create_token(
        self,
        kind: str,
        name: str = "",
        *,
        expires_at: float | None = None,
        max_workers: int | None = None,
    ) -> str:
        """A new admin or join token ("worker" is the API's older name for a join token)."""
        principal: PrincipalKind
        if kind in ("worker", "join"):
            principal = "join"
        elif kind == "admin":
            principal = "admin"
        else:
            raise UsageError(f"kind: admin or worker, not {kind!r}")
        token, _ = issue_token(
            self.store, principal, name, expires_at=expires_at, max_workers=max_workers
        )
        return token

    def _check_worker(self, caller: Principal | None, worker_id: str) -> None:
        if caller is None or caller.kind == "admin":
            return
        if caller.kind != "worker":
            raise ForbiddenError("a join token only registers workers")
        if caller.worker_id != worker_id:
            raise ForbiddenError(f"this credential is not worker {worker_id}'s")

    def own_attempt(self, attempt_id: int, caller: Principal | None) -> AttemptRecord:
        """The attempt, if it is the caller's and still its job's current one.

        ForbiddenError for another worker's attempt; StaleAttemptError once it was given up
        on (lost, fenced, finished) or its worker has registered again since."""
        attempt = self.store.get_attempt(attempt_id)
        if (
            caller is not None
            and caller.kind != "admin"
            and (caller.kind != "worker" or attempt.worker_id != caller.worker_id)
        ):
            raise ForbiddenError(f"attempt {attempt_id} is not this worker's")
        if attempt.state not in ACTIVE_ATTEMPT_STATES:
            raise StaleAttemptError(f"attempt {attempt_id} is no longer current ({attempt.state})")
        if attempt.worker_id is not None and attempt.worker_epoch is not None:
            worker = self.store.get_worker(attempt.worker_id)
            if worker.epoch != attempt.worker_epoch:
                raise StaleAttemptError(
                    f"attempt {attempt_id} belongs to an earlier life of its worker"
                )
        return attempt

    def check_job_access(self, job_id: str, caller: Principal | None) -> None:
        """A worker reads a job's bundle only while it runs an attempt of that job."""
        if caller is None or caller.kind == "admin":
            return
        if caller.kind == "worker" and any(
            a.job_id == job_id for a in self.store.active_attempts(caller.worker_id)
        ):
            return
        raise ForbiddenError(f"job {job_id} is not one this worker runs")

    def check_artifact_access(self, job_id: str, caller: Principal | None) -> None:
        """A worker reads another job's outputs only as an input of an attempt it runs."""
        if caller is None or caller.kind == "admin":
            return
        if caller.kind == "worker":
            for attempt in self.store.active_attempts(caller.worker_id):
                spec = self.store.get_job(attempt.job_id).spec
                for item in spec.get("inputs", []) or []:
                    # InputRef names it "artifact"; "source" is what older specs said.
                    source = (
                        str(item.get("artifact") or item.get("source") or "")
                        if isinstance(item, dict)
                        else ""
                    )
                    if self._names_job(source, job_id):
                        return
        raise ForbiddenError(f"job {job_id}'s outputs are not an input of this worker's jobs")

    def _names_job(self, source: str, job_id: str) -> bool:
        from gpulayer.protocol.messages import JOB_ARTIFACT_PREFIX, split_job_reference

        if not source.startswith(JOB_ARTIFACT_PREFIX):
            return False
        try:
            return self.resolve_job_id(split_job_reference(source)[0]) == job_id
        except Exception:
            return False

    def claim(self, worker_id: str, caller: Principal | None = None) -> list[Assignment]:
        """Assignments made for this worker that it has not started yet."""
        self._check_worker(caller, worker_id)
        claimed = []
        for attempt in self.store.active_attempts(worker_id):
            if attempt.state != "assigned":
                continue
            if not self.states.move_attempt(attempt.id, "running", started_at=time.time()):
                continue
            job = self.store.get_job(attempt.job_id)
            claimed.append(
                Assignment(
                    attempt_id=attempt.id,
                    job_id=job.id,
                    attempt=attempt.number,
                    spec=job.spec,
                    gpu_indices=attempt.gpu_indices,
                    working_dir=job.working_dir,
                    has_bundle=job.has_bundle,
                    gang=gangs.gang_node(self.store, job, attempt),
                )
            )
        return claimed

    def append_logs(
        self, attempt_id: int, lines: Sequence[tuple[str, str]], caller: Principal | None = None
    ) -> None:
        attempt = self.own_attempt(attempt_id, caller)  # a fenced attempt's output is not the job's
        node = attempt.node_rank if self._is_gang(attempt) else None
        # A job may print a NUL; no line is refused for it, it is stored repaired.
        storable = [(stream, repair_text(text)) for stream, text in lines]
        self.store.append_logs(attempt.job_id, attempt.number, storable, node=node)
        self.notify()

    def finish_attempt(
        self, attempt_id: int, report: AttemptReport, caller: Principal | None = None
    ) -> None:
        attempt = self.own_attempt(attempt_id, caller)
        if not self.states.move_attempt(
            attempt_id, report.state, reason=report.reason, exit_code=report.exit_code
        ):
            raise StaleAttemptError(f"attempt {attempt_id} is no longer current")
        self.placement.job_changed(attempt.job_id)  # a gang's other nodes may end with it
        self.placement.worker_changed(attempt.worker_id)
        if self._is_gang(attempt):
            self._finish_node(attempt, report)
        elif report.reason in _RETRYABLE_REASONS:
            self._retry_or_fail(attempt, report.reason, report.message or report.reason)
        else:
            self.states.move_job(
                attempt.job_id,
                report.state,
                only_from=["running"],
                reason=report.reason,
                message=report.message,
                exit_code=report.exit_code,
                result=report.result,
            )
        if self.is_terminal(attempt.job_id):
            self._forget_environment(attempt.job_id)
        self.dispatch()

    def record_outputs(
        self,
        attempt_id: int,
        files: Sequence[tuple[str, Path]],
        caller: Principal | None = None,
    ) -> None:
        """Keep the files an attempt wrote under GPULAYER_OUTPUT_DIR as its job's outputs.

        Only the job's current attempt may: the files are staged first and swapped in while
        the attempt is checked once more, so a stale attempt never replaces a newer one's.
        A gang's node 0 writes the top of the outputs, node r the folder ``node-<r>/``."""
        attempt = self.own_attempt(attempt_id, caller)
        node = attempt.node_rank if self._is_gang(attempt) else None
        staging = self.layout.root / "incoming" / f"outputs-{attempt_id}-{new_id('s')}"
        try:
            entries = []
            for relative, source in files:
                target = staging / relative
                if not target.resolve().is_relative_to(staging.resolve()):
                    raise UsageError(f"outputs: {relative!r} leaves the output folder")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)
                digest = hashlib.sha256()
                with target.open("rb") as stream:
                    for chunk in iter(lambda: stream.read(1 << 20), b""):
                        digest.update(chunk)
                entries.append((relative, target.stat().st_size, digest.hexdigest()))
            staging.mkdir(parents=True, exist_ok=True)
            with self._outputs_lock:
                self.own_attempt(attempt_id, caller)
                destination = self.layout.outputs_dir(attempt.job_id)
                prefix = None
                if node is not None:
                    prefix = gangs.node_output_prefix(node)
                    if prefix:
                        destination = destination / prefix.rstrip("/")
                    else:
                        gangs.carry_node_outputs(destination, staging)
                previous = destination.with_name(destination.name + f".old-{attempt_id}")
                if destination.exists():
                    destination.rename(previous)
                destination.parent.mkdir(parents=True, exist_ok=True)
                staging.rename(destination)
                shutil.rmtree(previous, ignore_errors=True)
                if node is None:
                    self.store.record_artifacts(attempt.job_id, sorted(entries))
                else:
                    self.store.record_node_artifacts(
                        attempt.job_id,
                        sorted((f"{prefix}{p}", s, h) for p, s, h in entries),
                        prefix=prefix or "",
                    )
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def record_output_archive(
        self, attempt_id: int, archive: Path, caller: Principal | None = None
    ) -> None:
        """A remote worker's outputs, sent as a tar.gz of its output folder."""
        import tempfile

        from gpulayer.protocol.bundle import extract_bundle

        self.own_attempt(attempt_id, caller)
        with tempfile.TemporaryDirectory(dir=self.layout.root) as scratch:
            extract_bundle(archive, Path(scratch))
            self.record_outputs(attempt_id, _regular_files(Path(scratch)), caller)

    # --- gangs ------------------------------------------------------------------------------

    def _is_gang(self, attempt: AttemptRecord) -> bool:
        return gangs.gang_size(self.store.get_job(attempt.job_id)) > 1

    def _finish_node(self, attempt: AttemptRecord, report: AttemptReport) -> None:
        """One node ended: a failure ends the whole gang at once; success waits for all."""
        if report.state == "succeeded":
            if report.result is not None:
                self.store.keep_node_result(attempt.id, report.result)
            end = gangs.after_node_success(self.store.gang_of(attempt))
            if end.state is not None:
                self.states.move_job(
                    attempt.job_id, end.state, only_from=["running"], exit_code=0, result=end.result
                )
            return
        self._end_gang(attempt, report.reason or "failed", report.message or report.reason or "")

    def _end_gang(self, attempt: AttemptRecord, reason: str, why: str) -> None:
        """Fail (or cancel) the job naming the node; the other nodes' attempts end with it."""
        job = self.store.get_job(attempt.job_id)
        where = gangs.node_label(self.store, attempt)
        cancelled = job.cancel_requested
        message = "cancelled" if cancelled else f"{where}: {why}"
        if self.states.move_job(
            job.id,
            "cancelled" if cancelled else "failed",
            only_from=["running"],
            reason="cancelled" if cancelled else reason,
            message=message,
        ):
            others = [a.node_rank for a in self.store.gang_of(attempt) if a.id != attempt.id]
            self.log_system(
                job.id,
                attempt.number,
                [f"{message}; ending the gang's other nodes {others}"] if not cancelled else [],
            )

    # --- faults -----------------------------------------------------------------------------

    def sweep_lost_workers(self) -> None:
        # Silence while this control plane was down is not held against a worker: its
        # heartbeats had nowhere to go. It gets a full timeout from our start.
        now = time.time()
        exempt = self.sweep_exempt()
        for worker in self.store.list_workers():
            silent_since = max(worker.last_heartbeat, self._started)
            if (
                worker.kind != "local"
                and worker.state == "ready"
                and now - silent_since > self.heartbeat_timeout
                and worker.id not in exempt
            ):
                self.store.set_worker_state(worker.id, "lost")
                self.placement.worker_changed(worker.id)
                for attempt in self.store.active_attempts(worker.id):
                    self._lose_attempt(attempt, f"worker {worker.name} stopped heartbeating")

    def _lose_attempt(self, attempt: AttemptRecord, why: str) -> None:
        if self.states.move_attempt(attempt.id, "failed", reason="worker_lost"):
            self.placement.job_changed(attempt.job_id)
            self.placement.worker_changed(attempt.worker_id)
            if self._is_gang(attempt):
                self._end_gang(attempt, "worker_lost", why)
            else:
                self._retry_or_fail(attempt, "worker_lost", why)

    def _retry_or_fail(self, attempt: AttemptRecord, reason: str, why: str) -> None:
        job = self.store.get_job(attempt.job_id)
        spec = JobSpec.model_validate(job.spec)
        retry_allowed = reason in spec.retry.retry_on and job.attempts < spec.retry.max_attempts
        if retry_allowed and not job.cancel_requested:
            self.states.move_job(job.id, "queued", only_from=["running"])
            self.log_system(job.id, attempt.number, [f"attempt {attempt.number}: {why}; retrying"])
        else:
            self.states.move_job(
                job.id,
                "cancelled" if job.cancel_requested else "failed",
                only_from=["running"],
                reason="cancelled" if job.cancel_requested else reason,
                message=why,
            )

    # --- cloud jobs: the moves the lifecycle reconciler makes --------------------------------

    def begin_provisioning(self, job_id: str, message: str) -> bool:
        """A machine is being prepared for the job."""
        moved = self.states.move_job(
            job_id, "provisioning", only_from=["queued"], message=message
        ) or self.store.update_job(job_id, expect_states=["provisioning"], message=message)
        self.notify()
        return moved

    def requeue_for_provisioning(self, job_id: str, why: str) -> None:
        if self.states.move_job(job_id, "queued", only_from=["provisioning"]):
            self.log_system(job_id, 0, [f"provisioning starts over: {why}"])

    def wait_for_capacity(self, job_id: str, why: str) -> None:
        """The job stays queued until capacity frees; says why once per change of reason."""
        job = self.store.get_job(job_id)
        moved = self.states.move_job(
            job_id, "queued", only_from=["provisioning"], message=why
        ) or self.store.update_job(job_id, expect_states=["queued"], message=why)
        if moved and job.message != why:
            self.log_system(job_id, 0, [why])

    def hand_to_reserved_worker(self, job_id: str) -> None:
        """The job's machine is ready: queue it for dispatch to its reserved worker."""
        self.states.move_job(job_id, "queued", only_from=["provisioning"])
        self.dispatch()

    def move_to_target(self, job_id: str, target: str) -> None:
        """The cloud cannot run it: the next fallback target in its chain may."""
        self.states.move_job(
            job_id, "queued", only_from=["provisioning"], target=target
        ) or self.store.update_job(job_id, expect_states=["queued"], target=target)
        self.dispatch()

    def fail_unplaced(self, job_id: str, reason: str, message: str) -> None:
        """A job that never ran ends: nothing can place it."""
        self.states.move_job(
            job_id, "failed", only_from=["queued", "provisioning"], reason=reason, message=message
        )
        self.notify()

    def end_worker_attempts(self, worker_id: str, reason: str, why: str) -> None:
        """The worker's machine is gone (reclaimed, unreachable): its attempts end with
        ``reason``, and their jobs retry if their retry_on says so."""
        for attempt in self.store.active_attempts(worker_id):
            if self.states.move_attempt(attempt.id, "failed", reason=reason):
                self.placement.job_changed(attempt.job_id)
                self._retry_or_fail(attempt, reason, why)
        self.store.set_worker_state(worker_id, "gone")
        self.placement.worker_changed(worker_id)
        self.dispatch()

    def retire_worker(self, worker_id: str) -> None:
        """Its machine is being handed back."""
        self.store.set_worker_state(worker_id, "gone")
        self.placement.worker_changed(worker_id)
        self.notify()

    def credit_worker_silence(self, worker_id: str) -> None:
        """The worker could not reach us because we were down: its silence starts now."""
        worker = self.store.get_worker(worker_id)
        if worker.state in ("ready", "lost"):
            self.store.set_worker_state(worker_id, worker.state, heartbeat=True)

    # --- scheduling -------------------------------------------------------------------------

    def worker_views(self, *, only_ready: bool = False) -> list[Any]:
        from gpulayer.control.dispatch import worker_snapshots

        return worker_snapshots(self.store, only_ready=only_ready)

    def waiting_reasons(self, job: JobRecord) -> list[str]:
        """Why a queued job has not started: per worker of its target, what does not fit now."""
        from gpulayer.control.targets import TARGET_WORKER_KIND
        from gpulayer.scheduler import WorkerIndex, fitting_now, node_count, reasons_now

        try:
            spec = JobSpec.model_validate(job.spec)
        except ValueError:
            return ["its stored spec does not validate; delete the job and submit it again"]
        if job.target == "cloud":
            return [job.message or "waiting for a machine to be provisioned"]
        views = [v for v in self.worker_views() if v.kind == TARGET_WORKER_KIND.get(job.target)]
        if not views:
            return [f"no {job.target} worker is registered"]
        reasons: list[str] = []
        nodes = node_count(spec)
        if nodes > 1:
            fit = fitting_now(spec, WorkerIndex(v.snapshot for v in views))
            reasons.append(f"{fit} of {nodes} nodes fit now")
        for view in views:
            found = reasons_now(spec, view.snapshot)
            reasons.extend(f"worker {view.snapshot.name}: {r}" for r in found)
        return (
            reasons
            if len(reasons) > (nodes > 1)
            else [*reasons, "waiting for its turn in the queue"]
        )

    def dispatch(self) -> int:
        """Place queued jobs on workers with room. Returns how many were assigned."""
        from gpulayer.control.dispatch import plan_assignments

        with self._dispatch_lock:
            assigned = 0
            for job_id, nodes in plan_assignments(self.store, self.placement):
                if len(nodes) > 1:
                    if self.store.assign_gang(job_id, nodes) is not None:
                        assigned += 1
                        self.log_system(job_id, 0, [gangs.placed_note(self.store, nodes)])
                    continue
                worker_id, gpus = nodes[0]
                if self.store.assign(job_id, worker_id, gpus) is not None:
                    assigned += 1
        self.notify()
        return assigned

    def log_system(self, job_id: str, attempt: int, notes: Sequence[str]) -> None:
        """gpulayer's own notes in a job's logs (streamed to whoever follows it)."""
        self.store.append_logs(job_id, attempt, [("system", note) for note in notes])
        self.notify()

    def live_jobs(self) -> int:
        return self.store.count_live_jobs()

    def is_terminal(self, job_id: str) -> bool:
        return self.store.get_job(job_id).state in TERMINAL_STATES


def _regular_files(root: Path) -> list[tuple[str, Path]]:
    """Regular files under root (links, fifos and devices are not outputs), by relative path."""
    found = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            found.append((path.relative_to(root).as_posix(), path))
    return found
