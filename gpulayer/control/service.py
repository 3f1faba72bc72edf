"""The control plane's service: jobs in, assignments out, reports back.

One class serves the embedded local control plane and the team server alike; the HTTP API and
the in-process local worker are two doors into it.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from gpulayer.control import gangs
from gpulayer.control.auth import Principal, issue_token
from gpulayer.control.job_states import ACTIVE_ATTEMPT_STATES, JobStates
from gpulayer.control.output_uploads import OutputLimits
from gpulayer.control.paths import HomeLayout
from gpulayer.control.progress import ServerProgress
from gpulayer.control.store import (
    TERMINAL_STATES,
    AttemptEnd,
    AttemptRecord,
    JobRecord,
    LogLine,
    QueuedHead,
    Store,
    WorkerRecord,
)
from gpulayer.control.store.once_keys import OnceKey
from gpulayer.control.targets import (
    TargetDecision,
    WorkerView,
    choose_target,
    may_leave_this_machine,
    refuse_missing_inputs,
    refuse_unschedulable,
    refuse_unshipped_inputs,
    target_after_cloud,
    with_default_target,
)
from gpulayer.control.text_checks import repair_text, unsafe_text
from gpulayer.control.worker_news import WorkerNews
from gpulayer.errors import (
    ForbiddenError,
    NotFoundError,
    SpecError,
    StaleAttemptError,
    UsageError,
)
from gpulayer.ids import new_id
from gpulayer.protocol.job_files import JobFileError, copy_job_file, root_of
from gpulayer.protocol.messages import (
    Assignment,
    AttemptReport,
    ClaimReply,
    FinishOutcome,
    HeartbeatReply,
    Registration,
)
from gpulayer.spec import JobSpec
from gpulayer.spec.capabilities import BoundedCapabilities
from gpulayer.spec.validate import validate_spec

log = logging.getLogger("gpulayer.control")

_RETRYABLE_REASONS = frozenset({"worker_lost", "preempted"})
_PASSES_PER_CALL = 2


class ControlService:
    def __init__(
        self, store: Store, layout: HomeLayout, *, heartbeat_timeout: float = 30.0
    ) -> None:
        self.store = store
        self.states = JobStates(store, on_queue_change=self._queue_moved)
        self.layout = layout
        self.heartbeat_timeout = heartbeat_timeout
        self._degraded: dict[str, str | None] = {}
        """What each worker last said of why it takes no job (see _note_degraded)."""
        self.output_limits = OutputLimits()
        """What one outputs upload of a remote worker may hold (see output_uploads)."""
        self._dispatch_lock = threading.Lock()
        self._dispatching = False
        self._dispatch_wanted = False
        self._dispatch_loud = False
        self._dispatch_asked: threading.Event | None = None
        """Set to ask the dispatcher thread for a pass (None: no such thread; passes are
        made by whoever asks for them)."""
        self._changed = threading.Condition()
        self._version = 0
        self._listeners: list[Callable[[], None]] = []
        self._cloud_listeners: list[Callable[[], None]] = []
        self.last_call = time.monotonic()
        self._started = time.time()
        self._serving = False
        self.progress = ServerProgress()
        """Beaten by the HTTP edge: stalls of this server never count against workers."""
        self.default_target = "local"
        """The target of a job whose spec names none: a team server sets remote (it has no
        local worker)."""
        self.cloud_available: Callable[[], bool] = lambda: False
        self.cloud_refusal: Callable[[JobSpec], str | None] = lambda spec: None
        self.cloud_plan: Callable[[JobSpec], dict[str, Any]] | None = None
        """Why no offer could ever take a cloud gang, asked at submit; None: it may run."""
        self.provisioner: Any = None
        # Workers whose silence is the control plane's own (their tunnel is being reopened).
        self.sweep_exempt: Callable[[], set[str]] = set
        # The submitting shell's environment for local jobs: memory only, never the store.
        self._client_env: dict[str, dict[str, str]] = {}
        self._cloud_env: dict[str, dict[str, str]] = {}
        self._outputs_lock = threading.Lock()
        self.news = WorkerNews()
        # Per worker, its life's epoch and the cancels its claim replies already carried.
        self._told_cancels: dict[str, tuple[int, set[int]]] = {}
        self._told_lock = threading.Lock()
        self._gang_sizes: dict[str, int] = {}  # a job's spec never changes once stored
        from gpulayer.control.bundle_store import BundleStore
        from gpulayer.control.dispatch import LivePlacement
        from gpulayer.control.token_service import TokenService

        self.bundles = BundleStore(layout.root)
        self.tokens = TokenService(store)
        """Tokens are an aggregate of their own: the API's token routes use it directly."""

        # The dispatch pass's workers, kept between passes: told below of every change.
        self.placement = LivePlacement(store)

    def _queue_moved(self, job_id: str, entered: bool) -> None:
        """A job moved into the queue or out of it (or out of a state next to it)."""
        if entered:
            self.placement.queue_changed()  # put back in line by its time: read with the rest
        else:
            self.placement.jobs_left_queue([job_id])

    # --- change notification ----------------------------------------------------------------

    def on_work(self, listener: Callable[[], None]) -> None:
        """Call listener whenever new assignments or cancellations may be waiting."""
        self._listeners.append(listener)

    def on_cloud_work(self, listener: Callable[[], None]) -> None:
        """Call listener whenever a job that a cloud may run was stored."""
        self._cloud_listeners.append(listener)

    def jobs_stored(
        self,
        heads: Sequence[QueuedHead],
        specs: Mapping[str, tuple[JobSpec, Mapping[str, str]]] | None = None,
    ) -> None:
        """Jobs stored queued (by a submit, a list submit or a schedule's run): the dispatch
        pass's queue takes them in (with ``specs``, the validated spec each stored one was
        dumped from, and its labels), and one for a cloud wakes whoever plans cloud work."""
        self.placement.jobs_queued(heads, specs)
        if any(head.target == "cloud" for head in heads):
            for listener in self._cloud_listeners:
                listener()

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

    def wake_workers(self, worker_ids: Iterable[str | None]) -> None:
        """Wake these workers' claim long-polls (and only theirs)."""
        self.news.wake(worker_ids)

    def wake_unclaimed(self) -> None:
        """Wake every worker with an assignment it has not claimed: another control plane
        sharing the store may have made it, and only this one holds the worker's long-poll."""
        self.wake_workers(self.store.workers_with_assigned())

    @property
    def serving(self) -> bool:
        """Whether this control plane has answered a call yet."""
        return self._serving

    def touch(self) -> None:
        self.last_call = time.monotonic()
        if not self._serving:
            # Workers could not reach us before we answered our first call: their silence
            # counts from now, not from when this process began starting up.
            self._serving = True
            self._started = time.time()

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
        bundle_digest: str | None = None,
        once: OnceKey | None = None,
    ) -> JobRecord:
        """Validate, choose a target, persist.

        `bundle` is an uploaded source tarball to keep for the job, `bundle_digest` one the
        bundle store keeps (the job's row names it); `source_dir` a local
        directory to snapshot into one (what changed meanwhile is added to `warnings`).
        Nothing is kept when the spec does not validate.
        """
        try:
            spec, views, decision, _ = self._decide(spec_data)
            refuse_unschedulable(spec, decision)
            base = working_dir or source_dir
            if decision.target == "local" and self.default_target == "local" and base:
                # The job runs on this machine, where its local inputs are read: one that is
                # not there now is refused rather than failed once the job starts.
                refuse_missing_inputs(spec, Path(base))
            refuse_unshipped_inputs(spec, self._shipped_inputs(spec, bundle or bundle_digest, base))
        except Exception:
            if bundle is not None:
                bundle.unlink(missing_ok=True)
            raise
        hint = self._no_remote_worker_hint(decision, views)
        if hint is not None:
            decision.notes.append(hint)
            if warnings is not None:
                warnings.append(hint)
        job_id = new_id("j")
        if source_dir is None and bundle is None and working_dir and may_leave_this_machine(spec):
            # Taken now, so later edits do not leak into the queued job; a run on this
            # machine's own worker still runs in place.
            source_dir = Path(working_dir)
        if source_dir is not None:
            bundle = self._bundle_of(spec, source_dir, working_dir, warnings)
        if client_env is not None and "cloud" in spec.placement.targets:
            from gpulayer.cloud.credentials import credential_variables

            # In memory only, for as long as the job may rent or end a machine; kept before
            # the job is, since the lifecycle loop may plan it at once.
            self._cloud_env[job_id] = credential_variables(client_env)
        with self.bundles.lock:
            kept_here = bundle is not None
            if bundle is not None:
                bundle_digest = self.bundles.keep(bundle)
            elif bundle_digest is not None:
                self.bundles.require(bundle_digest)
            try:
                job = self.store.insert_job(
                    job_id=job_id,
                    name=spec.name,
                    spec=spec.model_dump(mode="json"),
                    state="queued" if decision.target else "failed",
                    target=decision.target or spec.placement.target,
                    working_dir=working_dir,
                    bundle_digest=bundle_digest,
                    labels=dict(spec.labels),
                    reason=None if decision.target else "unschedulable",
                    message=decision.message or decision.skipped,
                    once=once,
                )
            except Exception:
                self._cloud_env.pop(job_id, None)
                if kept_here and bundle_digest is not None:
                    self.release_unused_bundle(bundle_digest)
                raise
        self.jobs_stored(_heads_of([job]), {job.id: (spec, job.labels)})
        if decision.notes or not decision.target:
            # Else the dispatch pass below tells whoever waits on a change.
            self.log_system(job.id, 0, decision.notes)
        if client_env is not None and decision.target == "local":
            self._client_env[job.id] = dict(client_env)
        if decision.target:
            self.dispatch()
        return self.store.get_job(job.id)

    def _bundle_of(
        self,
        spec: JobSpec,
        source_dir: Path,
        working_dir: str | None,
        warnings: list[str] | None,
    ) -> Path:
        """``source_dir`` snapshot as a bundle in the store's staging folder, for keep()."""
        from gpulayer.protocol.bundle import bundle_warning, create_bundle, local_input_paths

        inputs = None
        if may_leave_this_machine(spec):
            artifacts = [i.artifact for i in spec.inputs]
            inputs = local_input_paths(artifacts, Path(working_dir or source_dir))
        staged = self.bundles.staging_path()
        try:
            info = create_bundle(source_dir, staged, exclude=[self.layout.root], inputs=inputs)
        except Exception:
            staged.unlink(missing_ok=True)
            raise
        warning = bundle_warning(info)
        if warning and warnings is not None:
            warnings.append(warning)
        return staged

    def _shipped_inputs(
        self, spec: JobSpec, bundle: Path | str | None, base: Path | str | None
    ) -> set[int]:
        """The job's local-path inputs (by index) that travel in its bundle: an uploaded file,
        a kept one by digest, or the one this service makes of ``base`` (which carries those
        that exist there)."""
        from gpulayer.protocol.bundle import (
            is_machine_path,
            local_input_paths,
            shipped_input_indexes,
        )

        artifacts = [i.artifact for i in spec.inputs]
        if not may_leave_this_machine(spec) or not any(map(is_machine_path, artifacts)):
            return set()
        if isinstance(bundle, Path):
            return shipped_input_indexes(bundle)
        if bundle is not None:
            return shipped_input_indexes(self.bundles.path(bundle))
        if base is not None:
            return set(local_input_paths(artifacts, Path(base)))
        return set()

    def release_unused_bundle(self, digest: str) -> None:
        """Drop a kept bundle no job names (holding the bundle store's lock)."""
        if not self.store.bundle_in_use(digest):
            self.bundles.release(digest)

    def plan(self, spec_data: dict[str, Any], *, working_dir: str | None = None) -> dict[str, Any]:
        """Where the job would run and why (see gpulayer.control.plan), deciding as submit
        does; nothing is kept, uploaded or rented. What submit would refuse as bad input (a
        local input that is not there, read from ``working_dir``) raises as it would there."""
        from gpulayer.control.plan import plan_job

        spec, views, decision, cloud = self._decide(spec_data)
        if decision.target == "local" and self.default_target == "local" and working_dir:
            refuse_missing_inputs(spec, Path(working_dir))
        return plan_job(spec, views, decision, self.cloud_plan if cloud else None)

    def _decide(self, spec_data: dict[str, Any]) -> tuple[JobSpec, list[Any], TargetDecision, bool]:
        """The spec validated and its target chosen, as submit and plan both decide: with the
        workers seen and whether a cloud is at hand."""
        problems = unsafe_text(spec_data)
        if problems:
            raise SpecError(problems)
        spec = validate_spec(with_default_target(spec_data, self.default_target))
        # Checked only for jobs that may go to a cloud: it validates providers.yaml, whose
        # errors (ConfigError, exit 2) then refuse the job before anything is kept.
        cloud = "cloud" in spec.placement.targets and self.cloud_available()
        views = self.worker_views()
        decision = choose_target(
            spec, views, cloud_available=cloud, cloud_refusal=self.cloud_refusal
        )
        return spec, views, decision, cloud

    def _no_remote_worker_hint(
        self, decision: TargetDecision, views: Sequence[WorkerView]
    ) -> str | None:
        """On the local control plane, a job left waiting for a remote worker when none is
        registered: how one joins it (it waits, since one may)."""
        if self.default_target != "local" or decision.target != "remote":
            return None
        if any(view.kind == "remote" for view in views):
            return None
        return (
            "hint: no remote worker is registered with this machine's control plane; the job "
            "waits for one (`gpulayer token create --worker`, then `gpulayer worker start "
            "--server URL` elsewhere), or submit to a team server with GPULAYER_SERVER set"
        )

    def submit_many(
        self,
        items: Sequence[tuple[dict[str, Any], str | None, str | None]],
        *,
        once: OnceKey | None = None,
    ) -> list[JobRecord]:
        """Several jobs at once: (spec data, working dir, bundle digest) each. All are
        validated before any is kept (SpecError lines name ``jobs[i]``), then stored in one
        transaction and placed by one dispatch pass."""
        # A list often repeats one spec (launch_many, map, arrays): each distinct spec is
        # checked, validated, stored as JSON and placed once per call; the same data always
        # gives the same outcome against this call's one reading of the workers.
        checked: dict[str, tuple[JobSpec, dict[str, Any]] | SpecError] = {}
        specs: list[tuple[JobSpec, dict[str, Any], str]] = []
        problems: list[str] = []
        for index, (spec_data, _, _) in enumerate(items):
            key = _canonical(spec_data)
            outcome = checked.get(key)
            if outcome is None:
                with_target = with_default_target(spec_data, self.default_target)
                outcome = checked[key] = _checked_spec(with_target)
            if isinstance(outcome, SpecError):
                problems.extend(f"jobs[{index}].{line}" for line in outcome.lines)
            else:
                specs.append((*outcome, key))
        for index, ((spec, _, _), (_, _, digest)) in enumerate(
            zip(specs, items, strict=True) if not problems else ()
        ):
            try:
                # Only a bundle carries them: a list's working_dir is never bundled here.
                refuse_unshipped_inputs(spec, self._shipped_inputs(spec, digest, None))
            except UsageError as exc:
                problems.append(f"jobs[{index}].{exc}")
        if problems:
            raise SpecError(problems)
        views = self.worker_views()
        cloud_ready: bool | None = None
        rows: list[dict[str, Any]] = []
        notes: list[tuple[str, list[str]]] = []
        decisions: dict[str, TargetDecision] = {}
        with self.bundles.lock:
            for named in {digest for _, _, digest in items if digest is not None}:
                self.bundles.require(named)
            for (spec, stored, key), (_, working_dir, digest) in zip(specs, items, strict=True):
                decision = decisions.get(key)
                if decision is None:
                    cloud = False
                    if "cloud" in spec.placement.targets:
                        if cloud_ready is None:
                            cloud_ready = self.cloud_available()
                        cloud = cloud_ready
                    decision = decisions[key] = choose_target(
                        spec, views, cloud_available=cloud, cloud_refusal=self.cloud_refusal
                    )
                refuse_unschedulable(spec, decision, f"jobs[{len(rows)}].")
                job_id = new_id("j")
                rows.append(
                    {
                        "job_id": job_id,
                        "name": spec.name,
                        "spec": stored,
                        "state": "queued" if decision.target else "failed",
                        "target": decision.target or spec.placement.target,
                        "working_dir": working_dir,
                        "bundle_digest": digest,
                        "labels": dict(spec.labels),
                        "reason": None if decision.target else "unschedulable",
                        "message": decision.message or decision.skipped,
                    }
                )
                if decision.notes:
                    notes.append((job_id, list(decision.notes)))
            jobs = self.store.insert_jobs(rows, once=once)
        self.store.append_logs_many(
            [(job_id, 0, [("system", note) for note in job_notes]) for job_id, job_notes in notes]
        )
        self.jobs_stored(
            _heads_of(jobs),
            {job.id: (spec, job.labels) for job, (spec, _, _) in zip(jobs, specs, strict=True)},
        )
        if any(job.state == "queued" for job in jobs):
            self.dispatch()
        else:
            self.notify()
        return self.store.get_jobs([job.id for job in jobs])

    def array_jobs(self, array_id: str) -> list[JobRecord]:
        """A job array's jobs (submit --array), by index."""
        from gpulayer.control.arrays import ARRAY_LABEL, INDEX_LABEL

        jobs = self.store.jobs_with_label(ARRAY_LABEL, array_id)
        if not jobs:
            raise NotFoundError(f"array {array_id!r} not found")
        return sorted(jobs, key=lambda j: int(j.labels.get(INDEX_LABEL, "0") or 0))

    def cancel_array(self, array_id: str) -> list[JobRecord]:
        for job in self.array_jobs(array_id):
            if not job.terminal:
                self.cancel(job.id)
        return self.array_jobs(array_id)

    def job_environment(self, job_id: str) -> dict[str, str] | None:
        """The environment a local job starts from, if its submitter handed one over."""
        return self._client_env.get(job_id)

    def _forget_environment(self, job_id: str) -> None:
        self._client_env.pop(job_id, None)

    def cloud_environment(self, job_id: str) -> dict[str, str] | None:
        """The cloud credential variables of the `submit` that sent the job, if it sent any."""
        return self._cloud_env.get(job_id)

    def forget_cloud_environments(self, keep: set[str]) -> None:
        """Drop the cloud variables of ended jobs that hold no machine any more."""
        for job_id in list(self._cloud_env):
            if job_id in keep:
                continue
            try:
                ended = self.is_terminal(job_id)
            except NotFoundError:
                ended = True  # deleted
            if ended:
                self._cloud_env.pop(job_id, None)

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

    def list_jobs(
        self,
        *,
        states: Sequence[str] | None = None,
        labels: dict[str, str] | None = None,
        limit: int = 50,
    ) -> list[JobRecord]:
        """Newest first; with labels, only jobs holding every one of those pairs."""
        if not labels:
            return self.store.list_jobs(states=states, limit=limit)
        jobs, _ = self.store.jobs_page(states=states, labels=labels, limit=limit)
        # The store narrows by the labels' JSON text; the exact pairs are checked here.
        return [j for j in jobs if all(j.labels.get(k) == v for k, v in labels.items())]

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
            self.wake_workers(
                a.worker_id
                for a in self.store.attempts_for(job.id)
                if a.state in ACTIVE_ATTEMPT_STATES
            )
        self.notify()
        return self.store.get_job(job.id)

    def read_logs(
        self, job_ref: str, *, after: int = 0, wait: float = 0.0, node: int | None = None
    ) -> tuple[list[LogLine], JobRecord]:
        """Lines after the given id; with wait, block up to that long for news."""
        job_id = self.resolve_job_id(job_ref)
        if node is not None:
            owner = self.store.get_job(job_id)
            gangs.check_node_rank(owner, node)
            if gangs.gang_size(owner) == 1:
                node = None  # a single-node job's lines carry no rank; node 0 is all of them
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
        digest = self._bundle_digest_of(job)
        # Rows first: a crash between the two leaves stray files, never rows without them.
        shutil.rmtree(self.layout.job_dir(job.id), ignore_errors=True)
        if digest is not None:
            with self.bundles.lock:
                self.release_unused_bundle(digest)
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
        capabilities = BoundedCapabilities.model_validate(registration.capabilities)
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
        self._degraded.pop(worker.id, None)  # its capabilities were replaced whole
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
        self,
        worker_id: str,
        running: Sequence[int] = (),
        caller: Principal | None = None,
        degraded: str | None = None,
    ) -> HeartbeatReply:
        """Note the worker alive; settle what it runs against what the store says it runs.

        An attempt the worker reports but no longer owns is fenced (the worker ends it). An
        attempt the store has running there that the worker does not report, once it had a
        heartbeat timeout to show up (a claim whose reply was lost), is lost and retried."""
        self._check_worker(caller, worker_id)
        self.store.worker_heartbeat(worker_id)
        self.placement.worker_alive(worker_id)
        self._note_degraded(worker_id, degraded)
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

    def _note_degraded(self, worker_id: str, reason: str | None) -> None:
        """A worker that says it takes no job (its disk is full) is placed nothing until it
        says it takes them again; read from the store once per worker per control plane life,
        then only on a change."""
        known = self._degraded.get(worker_id, ...)
        if known is ...:
            try:
                known = self.store.get_worker(worker_id).capabilities.get("degraded")
            except NotFoundError:
                return  # no such worker: nothing to note, as its heartbeat itself is
        if known != reason:
            self.store.set_worker_degraded(worker_id, reason)
            self.placement.worker_changed(worker_id)
        self._degraded[worker_id] = reason

    def pending_signals(self, worker_id: str) -> HeartbeatReply:
        return HeartbeatReply(cancel_attempts=self.store.cancelled_attempt_ids(worker_id))

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
        return self._owned(*self.store.attempt_and_epoch(attempt_id), caller)

    @staticmethod
    def _owned(
        attempt: AttemptRecord, current_epoch: int | None, caller: Principal | None
    ) -> AttemptRecord:
        """The checks of own_attempt on an attempt and its worker's epoch as read."""
        attempt_id = attempt.id
        if (
            caller is not None
            and caller.kind != "admin"
            and (caller.kind != "worker" or attempt.worker_id != caller.worker_id)
        ):
            raise ForbiddenError(f"attempt {attempt_id} is not this worker's")
        if attempt.state not in ACTIVE_ATTEMPT_STATES:
            raise StaleAttemptError(f"attempt {attempt_id} is no longer current ({attempt.state})")
        if attempt.worker_id is not None and attempt.worker_epoch is not None:
            if current_epoch is None:
                raise NotFoundError(f"worker {attempt.worker_id!r} not found")
            if current_epoch != attempt.worker_epoch:
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

    def claim_start(self, worker_id: str, caller: Principal | None) -> tuple[int, int]:
        """A claim poll's start: the worker's news count it waits past, and its life's epoch.

        A poll belongs to the worker's life that sent it: once the worker registered again
        (restarted), a poll still open from before must not take the new life's work."""
        since = self.news.count(worker_id)
        self._check_worker(caller, worker_id)
        return since, self.store.get_worker(worker_id).epoch

    def claim_now(
        self, worker_id: str, caller: Principal | None, epoch: int, *, with_cancels: bool
    ) -> ClaimReply:
        """One look for what waits for this worker's life ``epoch``, without waiting."""
        reply = ClaimReply(assignments=self._claim(worker_id, caller, epoch))
        if with_cancels:
            reply.cancel_attempts = self._untold_cancels(worker_id, epoch)
        return reply

    def _untold_cancels(self, worker_id: str, epoch: int) -> list[int]:
        """Cancelled attempts of this worker its life ``epoch`` has not had in a claim reply;
        noted as told. Memory only: after a restart each is told once more, which a worker
        takes as the same cancel."""
        pending = self.store.cancelled_attempt_ids(worker_id)
        with self._told_lock:
            told_epoch, told = self._told_cancels.get(worker_id, (epoch, set()))
            if told_epoch != epoch:
                told = set()
            untold = [a for a in pending if a not in told]
            # Only what is still pending is kept: the memory stays as small as the cancels.
            self._told_cancels[worker_id] = (epoch, set(pending))
        return untold

    def _claim(self, worker_id: str, caller: Principal | None, epoch: int) -> list[Assignment]:
        """Assignments made for this worker's life ``epoch`` that it has not started yet. Every
        claim comes here through claim_poll (the HTTP route, the local link, tests alike)."""
        self._check_worker(caller, worker_id)
        waiting = [
            attempt
            for attempt in self.store.active_attempts(worker_id)
            if attempt.state == "assigned" and attempt.worker_epoch in (None, epoch)
        ]
        if not waiting:
            return []
        moved = self.states.start_attempts([a.id for a in waiting], started_at=time.time())
        started = [attempt for attempt in waiting if attempt.id in moved]
        if not started:
            return []
        on_this_machine = self.store.get_worker(worker_id).kind == "local"
        jobs = {job.id: job for job in self.store.get_jobs([a.job_id for a in started])}
        claimed = []
        for attempt in started:
            job = jobs.get(attempt.job_id)
            if job is None:
                continue  # deleted meanwhile: nothing is left to run
            self._note_gang_size(job)  # its logs and outcome need not read the job again
            claimed.append(
                Assignment(
                    attempt_id=attempt.id,
                    job_id=job.id,
                    attempt=attempt.number,
                    spec=job.spec,
                    gpu_indices=attempt.gpu_indices,
                    **self._source_for(job, on_this_machine=on_this_machine),
                    gang=gangs.gang_node(self.store, job, attempt),
                )
            )
        return claimed

    def _source_for(self, job: JobRecord, *, on_this_machine: bool) -> dict[str, Any]:
        """Where an assignment's source comes from: this machine's own worker runs in the
        submit folder itself; any other worker gets the bundle taken at submit (by digest,
        which workers cache), never a path of ours."""
        if on_this_machine and job.working_dir:
            return {"working_dir": job.working_dir, "has_bundle": False, "bundle_digest": None}
        return {
            "working_dir": None,
            "has_bundle": job.has_bundle,
            "bundle_digest": self._bundle_digest_of(job),
        }

    def _bundle_digest_of(self, job: JobRecord) -> str | None:
        if job.bundle_digest is not None or not job.has_bundle:
            return job.bundle_digest
        return self.bundles.digest_of(self.layout.job_dir(job.id))  # stored before schema 10

    def bundle_path(self, job_id: str) -> Path:
        """Where the job's source bundle is (NotFoundError when it has none)."""
        job = self.store.get_job(job_id)
        path = (
            self.bundles.path(job.bundle_digest)
            if job.bundle_digest is not None
            else self.layout.bundle_file(job_id)
        )
        if not job.has_bundle or not path.is_file():
            raise NotFoundError(f"job {job_id} has no source bundle")
        return path

    def append_logs(
        self, attempt_id: int, lines: Sequence[tuple[str, str]], caller: Principal | None = None
    ) -> None:
        attempt = self.own_attempt(attempt_id, caller)  # a fenced attempt's output is not the job's
        node = attempt.node_rank if self._is_gang(attempt) else None
        # A job may print a NUL; no line is refused for it, it is stored repaired.
        storable = [(stream, repair_text(text)) for stream, text in lines]
        self.store.append_logs(attempt.job_id, attempt.number, storable, node=node)
        self.notify()

    def finish_attempts(
        self,
        worker_id: str,
        reports: Sequence[tuple[int, AttemptReport]],
        caller: Principal | None = None,
    ) -> list[FinishOutcome]:
        """Several of one worker's attempts ending: each checked on its own, as
        ``finish_attempt`` would, those of jobs of one node ending as reported recorded in one
        write, and one dispatch pass after them all (see :meth:`dispatch_soon`)."""
        self._check_worker(caller, worker_id)
        outcomes: list[FinishOutcome | None] = [None] * len(reports)
        try:
            plain = self._plain_ends(reports, caller, outcomes)
            if plain:
                ends = [end for _, _, end in plain]
                for (at, attempt, end), done in zip(
                    plain, self.states.end_reported(ends), strict=True
                ):
                    if not done.attempt_moved:
                        outcomes[at] = FinishOutcome(
                            attempt_id=end.attempt_id,
                            outcome="stale",
                            detail=f"attempt {end.attempt_id} is no longer current",
                        )
                        continue
                    outcomes[at] = FinishOutcome(attempt_id=end.attempt_id, outcome="recorded")
                    self.placement.job_changed(attempt.job_id)
                    self.placement.worker_changed(attempt.worker_id)
                    if done.job_moved or self.is_terminal(attempt.job_id):
                        self._forget_environment(attempt.job_id)
            for at, (attempt_id, report) in enumerate(reports):
                if outcomes[at] is None:
                    outcomes[at] = self._finish_one(attempt_id, report, caller)
        finally:
            self.dispatch_soon()
        return [outcome for outcome in outcomes if outcome is not None]

    def _plain_ends(
        self,
        reports: Sequence[tuple[int, AttemptReport]],
        caller: Principal | None,
        outcomes: list[FinishOutcome | None],
    ) -> list[tuple[int, AttemptRecord, AttemptEnd]]:
        """The reports that end an attempt of a job of one node as reported (no retry, no
        gang), checked as own_attempt checks, by position; a report refused or stale here
        gets its outcome now. The attempts are read in one query."""
        found = self.store.attempts_and_epochs([attempt_id for attempt_id, _ in reports])
        plain = []
        for at, (attempt_id, report) in enumerate(reports):
            entry = found.get(attempt_id)
            try:
                if entry is None:
                    raise NotFoundError(f"attempt {attempt_id} not found")
                attempt = self._owned(*entry, caller)
            except StaleAttemptError as exc:
                outcomes[at] = FinishOutcome(
                    attempt_id=attempt_id, outcome="stale", detail=str(exc)
                )
                continue
            except (ForbiddenError, NotFoundError) as exc:
                outcomes[at] = FinishOutcome(
                    attempt_id=attempt_id, outcome="refused", detail=str(exc)
                )
                continue
            if report.reason in _RETRYABLE_REASONS or self._is_gang(attempt):
                continue
            plain.append((at, attempt, _reported_end(attempt, report)))
        return plain

    def _finish_one(
        self, attempt_id: int, report: AttemptReport, caller: Principal | None
    ) -> FinishOutcome:
        try:
            self.finish_attempt(attempt_id, report, caller, dispatch=False)
        except StaleAttemptError as exc:
            return FinishOutcome(attempt_id=attempt_id, outcome="stale", detail=str(exc))
        except (ForbiddenError, NotFoundError) as exc:
            return FinishOutcome(attempt_id=attempt_id, outcome="refused", detail=str(exc))
        return FinishOutcome(attempt_id=attempt_id, outcome="recorded")

    def finish_attempt(
        self,
        attempt_id: int,
        report: AttemptReport,
        caller: Principal | None = None,
        *,
        dispatch: bool = True,
    ) -> None:
        attempt = self.own_attempt(attempt_id, caller)
        if report.logs:
            node = attempt.node_rank if self._is_gang(attempt) else None
            storable = [(stream, repair_text(text)) for stream, text in report.logs]
            self.store.append_logs(attempt.job_id, attempt.number, storable, node=node)
        gang = self._is_gang(attempt)
        # A gang node's result ends with it in one write: the node that ends the gang then
        # reads every result its peers kept, even when they all report at the same moment.
        kept = {"result": report.result} if gang and report.result is not None else {}
        if not self.states.move_attempt(
            attempt_id, report.state, reason=report.reason, exit_code=report.exit_code, **kept
        ):
            raise StaleAttemptError(f"attempt {attempt_id} is no longer current")
        self.placement.job_changed(attempt.job_id)  # a gang's other nodes may end with it
        if report.reason in _RETRYABLE_REASONS and attempt.worker_id is not None:
            # A worker reports its attempt lost only as it stops (its machine shutting down):
            # no more work goes to it, the retry included, until it heartbeats again.
            self.store.move_worker(attempt.worker_id, "lost")
        self.placement.worker_changed(attempt.worker_id)
        ended = False
        if gang:
            self._finish_node(attempt, report)
        elif report.reason in _RETRYABLE_REASONS:
            self._retry_or_fail(
                attempt, report.reason, report.message or report.reason, result=report.result
            )
        else:
            # A success without a word keeps the job's message (a target skipped at submit).
            keep_message = report.message is None and report.state == "succeeded"
            said: dict[str, Any] = {} if keep_message else {"message": report.message}
            ended = self.states.move_job(
                attempt.job_id,
                report.state,
                only_from=["running"],
                reason=report.reason,
                exit_code=report.exit_code,
                result=report.result,
                **said,
            )
        # A report's state is always an end: a job this call moved there is not read back.
        if ended or self.is_terminal(attempt.job_id):
            self._forget_environment(attempt.job_id)
        if dispatch:
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
                # The local worker hands over the job's own folder: no link is followed, and
                # a file swapped for one since the worker walked the folder is left out.
                try:
                    with target.open("wb") as copy:
                        copy_job_file(root_of(relative, source), relative, copy, limit=sys.maxsize)
                except JobFileError as exc:
                    target.unlink()
                    log.warning("outputs of attempt %s: skipped %s", attempt_id, exc)
                    continue
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

    def receive_outputs(
        self, attempt_id: int, upload: BinaryIO, caller: Principal | None = None
    ) -> None:
        """A remote worker's outputs, a tar.gz of its output folder, unpacked as it is read;
        nothing of it is kept when it is refused."""
        import tempfile

        from gpulayer.control.output_uploads import extract_outputs

        self.own_attempt(attempt_id, caller)
        with tempfile.TemporaryDirectory(dir=self.layout.root) as scratch:
            extract_outputs(upload, Path(scratch), self.output_limits)
            self.record_outputs(attempt_id, _regular_files(Path(scratch)), caller)

    # --- gangs ------------------------------------------------------------------------------

    def _is_gang(self, attempt: AttemptRecord) -> bool:
        size = self._gang_sizes.get(attempt.job_id)
        if size is None:
            size = self._note_gang_size(self.store.get_job(attempt.job_id))
        return size > 1

    def _note_gang_size(self, job: JobRecord) -> int:
        size = gangs.gang_size(job)
        if len(self._gang_sizes) > 100_000:
            self._gang_sizes.clear()
        self._gang_sizes[job.id] = size
        return size

    def _finish_node(self, attempt: AttemptRecord, report: AttemptReport) -> None:
        """One node ended: a failure ends the whole gang at once; success waits for all; a
        cancel or a timeout lets every node end (and upload) before the gang ends."""
        if self._wind_down(attempt):
            return
        if report.state == "succeeded":
            end = gangs.after_node_success(self.store.gang_of(attempt))
            if end.state is not None:
                self.states.move_job(
                    attempt.job_id, end.state, only_from=["running"], exit_code=0, result=end.result
                )
            return
        self._end_gang(attempt, report.reason or "failed", report.message or report.reason or "")

    def _wind_down(self, attempt: AttemptRecord) -> bool:
        """True when the gang ends by cancel or timeout: then it ends once every node has
        reported, cancelled or failed naming the node that timed out first, with node 0's
        result (the reports a Trainer made)."""
        job = self.store.get_job(attempt.job_id)
        gang = self.store.gang_of(attempt)
        if not gangs.winding_down(gang, job.cancel_requested):
            return False
        if not gangs.all_ended(gang):
            return True
        result = gangs.leader_result(gang)
        timed_out = gangs.first_timed_out(gang)
        if job.cancel_requested or timed_out is None:
            self.states.move_job(
                job.id,
                "cancelled",
                only_from=["running"],
                reason="cancelled",
                message="cancelled",
                result=result,
            )
            return True
        limit = JobSpec.model_validate(job.spec).timeout_seconds or 0
        message = f"{gangs.node_label(self.store, timed_out)}: timed out after {limit:g} s"
        if self.states.move_job(
            job.id,
            "failed",
            only_from=["running"],
            reason="timeout",
            message=message,
            result=result,
        ):
            self.log_system(job.id, attempt.number, [message])
        return True

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
            result=gangs.leader_result(self.store.gang_of(attempt)),
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
        # heartbeats had nowhere to go. It gets a full timeout from our start. Nor is silence
        # while this control plane was stalled (frozen, or too busy to take the heartbeats
        # waiting for it): only time it could have heard the worker counts (progress.py).
        now = time.time()
        exempt = self.sweep_exempt()
        for worker in self.store.list_workers():
            silent_since = max(worker.last_heartbeat, self._started)
            if (
                worker.kind != "local"
                and worker.state == "ready"
                and self.progress.silence(silent_since, now) > self.heartbeat_timeout
                and worker.id not in exempt
            ):
                self.store.move_worker(worker.id, "lost")
                self.placement.worker_changed(worker.id)
                for attempt in self.store.active_attempts(worker.id):
                    self._lose_attempt(attempt, f"worker {worker.name} stopped heartbeating")

    def _lose_attempt(self, attempt: AttemptRecord, why: str) -> None:
        if self.states.move_attempt(attempt.id, "failed", reason="worker_lost"):
            self.placement.job_changed(attempt.job_id)
            self.placement.worker_changed(attempt.worker_id)
            if self._is_gang(attempt):
                if not self._wind_down(attempt):
                    self._end_gang(attempt, "worker_lost", why)
            else:
                self._retry_or_fail(attempt, "worker_lost", why)

    def _retry_or_fail(
        self, attempt: AttemptRecord, reason: str, why: str, *, result: Any = None
    ) -> None:
        """A lost or preempted attempt: its job retries, or ends keeping what the attempt
        reported (``result``; else the Trainer reports its log carries, since a machine lost
        under its job never said how it ended)."""
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
                result=result if result is not None else self._reports_from_log(attempt),
            )

    def _reports_from_log(self, attempt: AttemptRecord) -> dict[str, Any] | None:
        from gpulayer.protocol.train_reports import REPORT_LINE_PREFIX, reports_in_log

        lines = self.store.attempt_stdout_starting(
            attempt.job_id, attempt.number, REPORT_LINE_PREFIX
        )
        reports = reports_in_log(lines)
        return {"value": None, "metrics": reports, "node_rank": 0} if reports else None

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

    def move_to_target(self, job_id: str, target: str, why: str | None = None) -> None:
        """The cloud cannot run it: the next fallback target in its chain may. ``why`` replaces
        the job's message (the cloud's last word, "waiting for capacity", no longer holds)."""
        values: dict[str, Any] = {"target": target}
        if why is not None:
            values["message"] = why
        self.states.move_job(
            job_id, "queued", only_from=["provisioning"], **values
        ) or self.store.update_job(job_id, expect_states=["queued"], **values)
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
        self.store.move_worker(worker_id, "gone")
        self.placement.worker_changed(worker_id)
        self.dispatch()

    def retire_worker(self, worker_id: str) -> None:
        """Its machine is being handed back."""
        self.store.move_worker(worker_id, "gone")
        self.placement.worker_changed(worker_id)
        self.notify()

    def next_target(self, spec: JobSpec) -> tuple[str | None, list[str]]:
        """The target after cloud in the job's chain that can take it now, else None and,
        per fallback target, why not."""
        return target_after_cloud(spec, self.worker_views())

    def worker_credential(self, name: str) -> tuple[str, str]:
        """A new join token for a machine's worker, and the hash the store keeps of it: what
        the cloud lifecycle's port asks of this service, answered by the tokens service."""
        return self.tokens.worker_credential(name)

    def credit_worker_silence(self, worker_id: str) -> None:
        """The worker could not reach us because we were down: its silence starts now."""
        self.store.credit_worker_silence(worker_id)

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

    def start_dispatcher(self) -> Callable[[], None]:
        """From now on the passes that finishes ask for are made on a thread of their own, so
        a worker's batch of reports is answered once it is recorded, not after the pass its
        freed room starts; returns how to stop the thread. Without it (in process, in a
        test) every finish makes its pass before it returns."""
        asked = threading.Event()
        stopping = threading.Event()

        def passes() -> None:
            while True:
                asked.wait()
                if stopping.is_set():
                    return
                asked.clear()
                try:
                    self.dispatch()
                except Exception:
                    log.exception("dispatch pass failed")
                    stopping.wait(0.5)  # a store that keeps failing is not asked in a loop
                with self._dispatch_lock:
                    # Asked for again while its passes ran, with no other caller making them.
                    if self._dispatch_wanted and not self._dispatching:
                        asked.set()

        self._dispatch_asked = asked
        threading.Thread(target=passes, name="gpulayer-dispatch", daemon=True).start()

        def stop() -> None:
            self._dispatch_asked = None
            stopping.set()
            asked.set()

        return stop

    def dispatch_soon(self) -> None:
        """Ask for a dispatch pass: the dispatcher thread's where one runs (the caller goes on
        at once; passes asked for meanwhile are made together), else made now."""
        asked = self._dispatch_asked
        if asked is None:
            self.dispatch()
        else:
            asked.set()

    def dispatch(self, *, quiet: bool = False) -> int:
        """Place queued jobs on workers with room. Returns how many were assigned.

        Only the workers given work are woken; ``quiet`` (the periodic pass) tells the
        other listeners only when something was assigned."""
        # One pass at a time, and callers never queue behind it: a call made while a pass
        # runs asks for one more pass, which the running one makes before it returns. A caller
        # makes at most _PASSES_PER_CALL of them, so no request is kept making passes for
        # others; a pass still asked for then is the next caller's (or the periodic pass's).
        with self._dispatch_lock:
            self._dispatch_wanted = True
            self._dispatch_loud = self._dispatch_loud or not quiet
            if self._dispatching:
                return 0
            self._dispatching = True
        assigned = 0
        passes = 0
        try:
            while True:
                with self._dispatch_lock:
                    if not self._dispatch_wanted or passes >= _PASSES_PER_CALL:
                        self._dispatching = False
                        break
                    passes += 1
                    loud = self._dispatch_loud
                    self._dispatch_wanted = self._dispatch_loud = False
                assigned += self._dispatch_pass(quiet=not loud)
        except BaseException:
            with self._dispatch_lock:
                self._dispatching = False
            raise
        return assigned

    def _dispatch_pass(self, *, quiet: bool) -> int:
        from gpulayer.control.dispatch import plan_assignments

        woken: set[str] = set()
        assigned = 0
        plans = plan_assignments(self.store, self.placement)
        results = self.store.assign_all(plans)
        self.placement.jobs_left_queue(job_id for job_id, _ in plans)
        for (job_id, nodes), attempts in zip(plans, results, strict=True):
            if attempts is None:
                # No longer queued (another control plane took it, or it was cancelled): the
                # room it was given goes to the next pass, at once.
                with self._dispatch_lock:
                    self._dispatch_wanted = True
                continue
            assigned += 1
            woken.update(w for w, _ in nodes)
            if len(nodes) > 1:
                self.log_system(job_id, 0, [gangs.placed_note(self.store, nodes)])
        if assigned:
            self.wake_workers(woken)
        if assigned or not quiet:
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


def _canonical(spec_data: Any) -> str:
    """One text per spec data, whatever its keys' order (a spec is plain JSON data)."""
    import json

    try:
        return json.dumps(spec_data, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return f"unkeyed:{id(spec_data)}"  # not JSON data: checked on its own, and refused


def _checked_spec(spec_data: Any) -> tuple[JobSpec, dict[str, Any]] | SpecError:
    """The validated spec and the JSON it is stored as, or why it is refused."""
    try:
        found = unsafe_text(spec_data)
        if found:
            raise SpecError(found)
        spec = validate_spec(spec_data)
    except SpecError as exc:
        return exc
    return spec, spec.model_dump(mode="json")


def _regular_files(root: Path) -> list[tuple[str, Path]]:
    """Regular files under root (links, fifos and devices are not outputs), by relative path."""
    found = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            found.append((path.relative_to(root).as_posix(), path))
    return found


def _reported_end(attempt: AttemptRecord, report: AttemptReport) -> AttemptEnd:
    """The end a worker reported for an attempt of a job of one node, as the store keeps it
    (its log lines repaired like any of the job's output)."""
    return AttemptEnd(
        attempt_id=attempt.id,
        job_id=attempt.job_id,
        number=attempt.number,
        state=report.state,
        reason=report.reason,
        exit_code=report.exit_code,
        result=report.result,
        message=report.message,
        # A success without a word keeps the job's message (a target skipped at submit).
        keep_message=report.message is None and report.state == "succeeded",
        logs=[(stream, repair_text(text)) for stream, text in report.logs],
    )


def _heads_of(jobs: Sequence[JobRecord]) -> list[QueuedHead]:
    return [QueuedHead(job.id, job.target, job.created_at) for job in jobs if job.state == "queued"]
