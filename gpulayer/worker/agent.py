"""The worker agent: takes assignments from a control plane, runs them, reports back.

The same agent serves the embedded local worker (over an in-process link) and remote workers
(over HTTP); only the ControlLink differs.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from gpulayer.backoff import WORKER_PREPARE
from gpulayer.errors import ControlPlaneError, ForbiddenError, StaleAttemptError
from gpulayer.protocol.client import Unauthorized
from gpulayer.protocol.messages import (
    SETUP_LOG_PREFIX,
    Assignment,
    AttemptReport,
    FinishOutcome,
    HeartbeatReply,
    Registration,
)
from gpulayer.worker.attempt_env import array_env as _array_env
from gpulayer.worker.attempt_env import device_env as _device_env
from gpulayer.worker.attempt_env import node_place as _node_place
from gpulayer.worker.attempt_env import with_secrets as _with_secrets
from gpulayer.worker.bundle_cache import source_bundle
from gpulayer.worker.containment import AttemptGroup, Containment, reap_orphans
from gpulayer.worker.disk import disk_trouble, remove_attempt_folder, sweep_attempt_folders
from gpulayer.worker.finish_batch import FinishBatcher
from gpulayer.worker.identities import UidPool, take_back
from gpulayer.worker.logship import LogShipper
from gpulayer.worker.outputs import DEFAULT_MAX_FILE_BYTES
from gpulayer.worker.process import RunAs

# The link, and the way an attempt's outputs and report travel back, live in sending.py;
# ControlLink is re-exported here, where callers have always found it.
from gpulayer.worker.sending import ControlLink as ControlLink
from gpulayer.worker.sending import claim_retrying, noted, send_report, store_outputs
from gpulayer.worker.warm_pool import WarmPool

log = logging.getLogger("gpulayer.worker")

# An attempt's last lines up to this size go with its outcome, in the same request.
_LOGS_WITH_OUTCOME_BYTES = 256 << 10
# What a job killed by the signals a machine going away sends (a shutdown, a Slurm step
# ending) exits with; the worker's own stop follows within moments.
_OUTSIDE_STOP_EXITS = frozenset({-signal.SIGTERM, -signal.SIGKILL})
OUTSIDE_STOP_WAIT_SECONDS = 5.0
T = TypeVar("T")


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
        on_revoked: Callable[[], None] | None = None,
        run_as: RunAs | None = None,
        uid_pool: UidPool | None = None,
        max_output_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        contain: bool = True,
        setup_cache: Path | None = None,
        stopped_with_its_machine: bool = False,
        machine_paths: bool = False,
        keep_attempts_seconds: float = 0.0,
        attempt_quota_bytes: int = 0,
    ) -> None:
        """``stopped_with_its_machine``: the worker of a rented machine, whose jobs may be
        signalled by the same shutdown that stops it (see ``_killed_with_its_machine``).
        ``machine_paths``: the local control plane's own worker, which runs as the user who
        submits its jobs: it reads their local paths and runs them in their folders. Any
        other worker opens no path of its machine that a job names.
        ``keep_attempts_seconds``: how long an ended attempt's folder stays (0: it goes once
        its outputs are stored). ``attempt_quota_bytes``: each attempt's folder is a filesystem
        of this size of its own (0: none)."""
        self.machine_paths = machine_paths
        self.keep_attempts_seconds = keep_attempts_seconds
        self.attempt_quota_bytes = attempt_quota_bytes
        self.degraded: str | None = None
        """Why the worker takes no job now (its disk is full), sent with each heartbeat."""
        self._live_dirs: set[Path] = set()
        self._swept_at = 0.0
        self.link = link
        self.stopped_with_its_machine = stopped_with_its_machine
        self.registration = registration
        self.work_root = work_root
        self.setup_cache = setup_cache or work_root / ".setup-envs"
        self.heartbeat_seconds = heartbeat_seconds
        self.claim_wait_seconds = claim_wait_seconds
        self.run_as = run_as
        self.uid_pool = uid_pool
        self.max_output_file_bytes = max_output_file_bytes
        self.worker_id: str | None = None
        self._on_contact = on_contact or (lambda: None)
        self._runs: dict[int, object] = {}
        self._held: set[int] = set()  # claimed, from the claim's reply until the report lands
        self._runs_lock = threading.Lock()
        # One fetch per source digest at a time: a burst of jobs from one submit would
        # otherwise all download the bundle before the first copy reaches the cache.
        self._bundle_locks: dict[str, threading.Lock] = {}
        self._finishes = FinishBatcher(self._send_finishes)
        self._stop = threading.Event()
        self._stopping_because = ("worker_lost", "the worker stopped")
        self._abandon = threading.Event()
        self._cancel_requested: set[int] = set()
        self._fenced: set[int] = set()
        self._job_threads: list[threading.Thread] = []
        self._threads: list[threading.Thread] = []
        self.revoked = threading.Event()
        """Set once the control plane refused this worker's credential (401, or 403 to a call
        about the worker itself): its attempts are ended and nothing more is sent."""
        self.revoked_because: str | None = None
        self._on_revoked = on_revoked or (lambda: None)
        self._prepared = False
        self.containment: Containment | None = None
        if contain:
            self.work_root.mkdir(parents=True, exist_ok=True)
            self.containment = Containment.for_worker(self.work_root)
        self.warm = WarmPool(work_root, self.containment, enabled=uid_pool is None)

    def start(self) -> str:
        # Once per worker, however often registering is retried: one sweep, one sentinel.
        if self.containment is not None and not self._prepared:
            left = self.containment.sweep()
            if left:
                log.warning("ended %d process(es) an earlier run of this worker left", left)
            self.containment.start_sentinel()
        if self.uid_pool is not None and not self._prepared:
            left = self.uid_pool.reclaim_all(self.work_root)
            if left:
                log.warning("ended %d process(es) of --run-as-range uids an earlier run left", left)
        if not self._prepared:
            # An earlier life's attempts are over: their folders go as any ended one's would.
            self._sweep(force=True)
        self._prepared = True
        self.worker_id = self.link.register(self.registration)
        for target, name in ((self._claim_loop, "claim"), (self._heartbeat_loop, "heartbeat")):
            thread = threading.Thread(target=target, name=f"gpulayer-worker-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self.worker_id

    def stop(
        self,
        *,
        cancel_running: bool = True,
        reason: str = "worker_lost",
        message: str = "the worker stopped",
    ) -> None:
        """Stop taking work; running attempts get their grace, keep what they wrote and are
        reported as ended by ``reason`` (worker_lost or preempted: so they retry if their
        retry_on says so)."""
        self._stopping_because = (reason, message)
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
        self.warm.close()
        if self.containment is not None:
            self.containment.stop_sentinel()

    def longest_grace(self) -> float:
        """The longest grace_seconds among the running attempts: how long a stop may take to
        let them end and upload what they wrote."""
        with self._runs_lock:
            runs = list(self._runs.values())
        return max((float(run.ctx.spec.grace_seconds) for run in runs), default=0.0)  # type: ignore[attr-defined]

    @property
    def running(self) -> int:
        with self._runs_lock:
            return len(self._runs)

    def _claim_loop(self) -> None:
        assert self.worker_id is not None
        while not self._stop.is_set():
            if self._lacks_room():
                self._stop.wait(self.heartbeat_seconds)
                continue
            try:
                claim_retrying(functools.partial(self._claim_once, self.worker_id), self._stop)
            except (Unauthorized, ForbiddenError) as exc:
                self.credential_refused(exc)
                return
            except Exception:
                return  # stopped while the control plane was away

    def _claim_once(self, worker_id: str) -> None:
        reply = self.link.claim(worker_id, self.claim_wait_seconds)
        self._on_contact()
        # Cancels first: an assignment cancelled in the same reply starts as cancelled.
        self.apply_cancels(reply.cancel_attempts)
        for assignment in reply.assignments:
            with self._runs_lock:
                self._held.add(assignment.attempt_id)
            thread = threading.Thread(
                target=self._run_assignment,
                args=(assignment,),
                name=f"gpulayer-job-{assignment.job_id}",
                daemon=True,
            )
            thread.start()
            self._job_threads.append(thread)
        self._job_threads = [t for t in self._job_threads if t.is_alive()]

    def _lacks_room(self) -> bool:
        """Whether the work dir lacks room for another job: then the worker claims none (a
        job it could not prepare would fail) and says so until room returns."""
        trouble = disk_trouble(self.work_root)
        if trouble and self.keep_attempts_seconds > 0:
            # Kept folders are for looking into, not worth a worker that takes no jobs.
            with self._runs_lock:
                live = set(self._live_dirs)
            if sweep_attempt_folders(self.work_root, 0, live):
                log.warning("the disk is full: removed ended attempts' folders kept before")
                trouble = disk_trouble(self.work_root)
        if trouble != self.degraded:
            if trouble:
                log.warning(
                    "degraded: %s under %s; taking no jobs until room returns",
                    trouble,
                    self.work_root,
                )
            else:
                log.warning("no longer degraded: taking jobs again")
            self.degraded = trouble
        return trouble is not None

    def _sweep(self, *, force: bool = False) -> None:
        """Remove ended attempts' folders kept past --keep-attempts (every minute at most)."""
        import time

        if not force and (
            self.keep_attempts_seconds <= 0 or time.monotonic() - self._swept_at < 60
        ):
            return
        self._swept_at = time.monotonic()
        with self._runs_lock:
            live = set(self._live_dirs)
        sweep_attempt_folders(self.work_root, self.keep_attempts_seconds, live)

    def _heartbeat_loop(self) -> None:
        assert self.worker_id is not None
        while not self._stop.wait(self.heartbeat_seconds):
            with self._runs_lock:
                held = sorted(self._held)
            self._sweep()
            try:
                self.apply_signals(self.link.heartbeat(self.worker_id, held, self.degraded))
                self._on_contact()
            except (Unauthorized, ForbiddenError) as exc:
                self.credential_refused(exc)
                return
            except Exception as exc:
                log.warning("heartbeat failed (%s)", exc)
            if self.containment is not None and self.containment.mode == "subreaper":
                reap_orphans(keep=self._leaders())

    def _leaders(self) -> set[int]:
        with self._runs_lock:
            runs = list(self._runs.values())
        return {pid for run in runs if (pid := getattr(run, "leader_pid", None)) is not None}

    def credential_refused(self, exc: BaseException) -> None:
        """The control plane no longer takes this worker's credential: end every attempt at
        once (their outcomes can no longer be reported, and a retry elsewhere must not race
        them), send nothing more, and let the worker exit."""
        if self.revoked.is_set():
            return
        self.revoked_because = str(exc)
        self.revoked.set()
        self._stop.set()
        self._abandon.set()
        with self._runs_lock:
            attempts = list(self._runs) + list(self._held)
        for attempt_id in attempts:
            self._fenced.add(attempt_id)
            self._end_run(attempt_id)
        self._on_revoked()

    def apply_signals(self, reply: HeartbeatReply) -> None:
        self.apply_cancels(reply.cancel_attempts)
        with self._runs_lock:
            held = set(self._held)
        for attempt_id in reply.fenced_attempts:
            # One whose report landed while the heartbeat was on its way is simply done.
            if attempt_id in held:
                self._fence(attempt_id, "the control plane gave it up")

    def apply_cancels(self, attempt_ids: list[int]) -> None:
        """End these attempts as cancelled (the claim reply and the heartbeat both carry them)."""
        self._cancel_requested.update(attempt_ids)
        for attempt_id in attempt_ids:
            self._end_run(attempt_id)

    def _end_run(self, attempt_id: int) -> None:
        with self._runs_lock:
            run = self._runs.get(attempt_id)
        if run is not None:
            run.cancel()  # type: ignore[attr-defined]

    def _fence(self, attempt_id: int, why: object) -> None:
        """The control plane gave this attempt up: end its processes, send nothing more."""
        if attempt_id not in self._fenced:
            log.warning("attempt %s is no longer this worker's (%s); ending it", attempt_id, why)
        self._fenced.add(attempt_id)
        self._end_run(attempt_id)

    def _send_logs(self, attempt_id: int, lines: list[tuple[str, str]]) -> None:
        if attempt_id in self._fenced:
            return  # dropped: the job's log belongs to its current attempt
        try:
            self.link.append_logs(attempt_id, lines)
        except Unauthorized as exc:
            self.credential_refused(exc)
        except (StaleAttemptError, ForbiddenError) as exc:
            self._fence(attempt_id, exc)

    def _run_assignment(self, assignment: Assignment) -> None:
        attempt_id = assignment.attempt_id
        attempt_dir = self.work_root / assignment.job_id / f"attempt-{assignment.attempt}"
        # A claim that waited while the disk filled can still bring a job: the check makes
        # room from kept folders first, so the job does not fail for want of what they hold.
        self._lacks_room()
        with self._runs_lock:
            self._live_dirs.add(attempt_dir)
        attempt_dir.mkdir(parents=True, exist_ok=True)
        shipper = LogShipper(lambda lines: self._send_logs(attempt_id, lines))
        shipper.start()
        group = self.containment.attempt(attempt_id) if self.containment is not None else None
        report: AttemptReport
        uid: int | None = None
        try:
            if self.attempt_quota_bytes:
                from gpulayer.worker.attempt_quota import mount_quota

                mount_quota(attempt_dir, self.attempt_quota_bytes)
            run_as = self.run_as
            if self.uid_pool is not None:
                uid = self.uid_pool.take()
                run_as = RunAs(f"gpulayer-{uid}", uid, uid, str(attempt_dir))
            report = self._run_job(assignment, attempt_dir, shipper, group, run_as)
        except Unauthorized as exc:
            self.credential_refused(exc)
            report = AttemptReport(state="failed", reason="worker_lost", message=str(exc))
        except (StaleAttemptError, ForbiddenError) as exc:
            self._fence(attempt_id, exc)
            report = AttemptReport(state="failed", reason="worker_lost", message=str(exc))
        except ControlPlaneError as exc:
            # Out of reach for longer than the preparation waits, or the worker is stopping
            # (its dead-man switch fired): the attempt was lost with its control plane, and
            # may be retried as such, rather than failing as this worker's error.
            shipper.add("system", f"worker: {exc}\n")
            report = AttemptReport(
                state="failed",
                reason="worker_lost",
                message=f"the control plane was out of reach while preparing the job: {exc}",
            )
        except Exception as exc:  # the job fails with a reason; the worker lives on
            log.exception("attempt %s failed to run", attempt_id)
            shipper.add("system", f"worker error: {type(exc).__name__}: {exc}\n")
            report = AttemptReport(state="failed", reason="worker_error", message=str(exc))
        finally:
            with self._runs_lock:
                self._runs.pop(attempt_id, None)
            shipper.close()
            all_ended = group.close() if group is not None else False
            if uid is not None and self.uid_pool is not None:
                take_back(attempt_dir)  # the uid's next attempt finds nothing of this one's
                self.uid_pool.release(uid, all_ended=all_ended)
        report = self._ended_by_the_stop(assignment, report)
        if attempt_id not in self._fenced:
            send_report(
                self._finishes,
                attempt_id,
                report,
                abandon=self._abandon,
                refused=self.credential_refused,
            )
        with self._runs_lock:
            self._held.discard(attempt_id)
        self._attempt_over(attempt_dir)  # once reported: the job's room frees sooner

    # _run_assignment's parts: the attempt's run itself, and how the worker's own stop
    # rewrites its end. Methods of their own so _run_assignment reads as the attempt's
    # frame (its folder, its logs, its uid, its report).

    def _run_job(
        self,
        assignment: Assignment,
        attempt_dir: Path,
        shipper: LogShipper,
        group: AttemptGroup | None,
        run_as: RunAs | None,
    ) -> AttemptReport:
        """Run the attempt's job to its end, store its outputs; its report, with its last logs."""
        from gpulayer.spec import JobSpec
        from gpulayer.worker.runner import JobRun, RunContext

        attempt_id = assignment.attempt_id
        spec = JobSpec.model_validate(assignment.spec)
        bundle = self._bundle(assignment, attempt_dir) if assignment.has_bundle else None
        context = RunContext(
            job_id=assignment.job_id,
            attempt=assignment.attempt,
            spec=spec,
            job_dir=attempt_dir,
            bundle=bundle,
            source_dir=(
                Path(assignment.working_dir)
                if assignment.working_dir and self.machine_paths
                else None
            ),
            resolve_artifact=lambda ref: self._while_reachable(
                f"fetching input {ref}",
                lambda: self.link.resolve_artifact(ref, attempt_dir / "fetched"),
            ),
            extra_env={
                **_device_env(spec.resources.accelerator, assignment.gpu_indices),
                **_array_env(spec.labels),
            },
            worker_env=_with_secrets(self.link.job_environment(assignment.job_id), assignment),
            group=group,
            run_as=run_as,
            node=_node_place(assignment),
            setup_cache=self.setup_cache,
            machine_paths=self.machine_paths,
            masked=self._credentials(),
            warm=self.warm.entry(assignment.bundle_digest),
            rented_machine=self.stopped_with_its_machine,
        )
        run = JobRun(context, on_log=functools.partial(_ship, shipper))
        with self._runs_lock:
            self._runs[attempt_id] = run
        if attempt_id in self._fenced | self._cancel_requested or self._stop.is_set():
            run.cancel()  # or claimed as the worker began to stop: it ends as the others do
        outcome = run.run()
        if attempt_id not in self._fenced:
            store_outputs(
                self.link,
                assignment,
                outcome.output_dir,
                shipper,
                max_file_bytes=self.max_output_file_bytes,
                abandon=self._abandon,
                cancelled=lambda: self._cancelled(assignment),
                refused=self.credential_refused,
                fence=self._fence,
            )
        tail = shipper.take(_LOGS_WITH_OUTCOME_BYTES)
        if tail is None:
            shipper.flush()
            tail = shipper.take(_LOGS_WITH_OUTCOME_BYTES) or []
        report = AttemptReport(
            state=outcome.state,
            reason=outcome.reason,
            exit_code=outcome.exit_code,
            result=outcome.result,
            message=outcome.message,
            logs=tail,
        )
        if self._cancelled(assignment) and outcome.state != "cancelled":
            report = AttemptReport(
                state="cancelled", reason="cancelled", message="cancelled", logs=tail
            )
        return report

    def _ended_by_the_stop(self, assignment: Assignment, report: AttemptReport) -> AttemptReport:
        """The report, or the worker's stop in its place when that stop ended the job."""
        if self._killed_with_its_machine(report) and not self._cancelled(assignment):
            # The signal that is stopping this worker too (a machine shutting down, a Slurm
            # step ending, each signal every process) killed the job first: it did not fail,
            # its machine went away. Its end is the worker's stop, with the stop's reason.
            reason, message = self._stopping_because
            report = AttemptReport(
                state="failed",
                reason=reason,
                message=f"{message} ({report.message})",
                exit_code=report.exit_code,
                result=report.result,
                logs=report.logs,
            )
        if self._stop.is_set() and report.state == "cancelled" and not self._cancelled(assignment):
            # The worker is shutting down: the job did not choose to end, so it may retry. What
            # it reported before the end (a Trainer's reports) stays with it.
            reason, message = self._stopping_because
            report = AttemptReport(
                state="failed",
                reason=reason,
                message=message,
                result=report.result,
                logs=report.logs,
            )
        return report

    def _credentials(self) -> tuple[str, ...]:
        """What the worker authenticates with (its join token, its own credential)."""
        values = getattr(self.link, "credentials", None)
        return tuple(values()) if callable(values) else ()

    def _attempt_over(self, attempt_dir: Path) -> None:
        """Its outputs are stored (or never will be): the folder goes, or is kept for
        --keep-attempts counted from now."""
        try:
            if self.keep_attempts_seconds > 0:
                os.utime(attempt_dir, follow_symlinks=False)
            else:
                remove_attempt_folder(attempt_dir, maybe_mounted=bool(self.attempt_quota_bytes))
        except OSError as exc:
            log.warning("cannot retire %s (%s)", attempt_dir, exc)
        finally:
            with self._runs_lock:
                self._live_dirs.discard(attempt_dir)

    def _killed_with_its_machine(self, report: AttemptReport) -> bool:
        """Whether a job killed by SIGTERM or SIGKILL from outside died of this worker's own
        stop: the worker's signal may be handled a moment after the job's, so its stop is
        waited for, OUTSIDE_STOP_WAIT_SECONDS at most."""
        if not self.stopped_with_its_machine or report.reason != "exit_code":
            return False
        if report.exit_code not in _OUTSIDE_STOP_EXITS:
            return False
        return self._stop.wait(OUTSIDE_STOP_WAIT_SECONDS)

    def _bundle(self, assignment: Assignment, attempt_dir: Path) -> Path:
        """The job's source bundle, through this worker's cache (see bundle_cache)."""
        fetched = attempt_dir / "source.tar.gz"
        fetch = functools.partial(
            self._while_reachable,
            "fetching the job's source",
            functools.partial(self.link.fetch_bundle, assignment.job_id, fetched),
        )
        return source_bundle(
            assignment.bundle_digest,
            attempt_dir,
            self.work_root,
            fetch,
            self._runs_lock,
            self._bundle_locks,
        )

    def _while_reachable(self, what: str, call: Callable[[], T]) -> T:
        """``call``, tried again while the control plane is out of reach (restarting, its
        tunnel being reopened) until the policy gives up or the worker stops; then its
        ControlPlaneError passes on."""
        for attempt in WORKER_PREPARE.retrying(
            retry_on=(ControlPlaneError,),
            stop_event=self._stop,
            before_sleep=noted(what),
        ):
            with attempt:
                return call()
        raise AssertionError("unreachable")  # tenacity re-raises the last error

    def _cancelled(self, assignment: Assignment) -> bool:
        return assignment.attempt_id in self._cancel_requested

    def _send_finishes(self, reports: Sequence[tuple[int, AttemptReport]]) -> list[FinishOutcome]:
        assert self.worker_id is not None  # attempts are claimed after registration
        return self.link.finish_many(self.worker_id, reports)


def _ship(shipper: LogShipper, stream: str, text: str) -> None:
    """Only gpulayer's own notes wait for the first batch: the job's output goes at the usual
    pace (whoever follows the logs sees it as soon as before), and so do setup's lines (the
    setup phase's span is read from when they arrive)."""
    shipper.add(stream, text)
    if stream != "system" or text.startswith(SETUP_LOG_PREFIX):
        shipper.hurry()
