"""The worker assembled: probe, registration, HTTP link, dead-man switch, join, run until
stopped. `gpulayer worker start` parses its flags into WorkerOptions and calls run_worker; the
embedded control plane calls start_local_worker with its in-process link.

Everything heavy is imported inside the functions, so the CLI can import this module at
start-up for the options type alone.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import threading

    from gpulayer.protocol.deadman import DeadmanAction
    from gpulayer.protocol.messages import Registration
    from gpulayer.worker.agent import ControlLink, WorkerAgent
    from gpulayer.worker.identities import UidPool
    from gpulayer.worker.process import RunAs

log = logging.getLogger("gpulayer.worker")

DEADMAN_FIRED_EXIT_CODE = 3
REFUSED_EXIT_CODE = 4
"""The control plane refused the worker's credential (revoked, expired) or its join token."""
REVOKED_LINE = "error: this worker's credential was revoked; its jobs were ended"


@dataclass(frozen=True)
class WorkerOptions:
    """What a remote or cloud worker runs with (the flags of `gpulayer worker start`)."""

    server_url: str
    token: str
    """The join token; the worker swaps it for its own credential once registered."""
    home_root: Path
    """gpulayer's home on this machine: attempts run under it unless work_dir says otherwise."""
    name: str | None = None
    kind: Literal["remote", "cloud"] = "remote"
    labels: dict[str, str] = field(default_factory=dict)
    work_dir: Path | None = None
    address: str | None = None
    heartbeat_seconds: float = 5.0
    run_as: str | None = None
    run_as_range: str | None = None
    """``FIRST-LAST``: each live attempt runs as a uid of its own from this range."""
    require_isolation: bool = False
    """Refuse to start unless each attempt gets a uid of its own."""
    max_output_file_bytes: int = 10 * 1024**3
    provider: str | None = None
    region: str | None = None
    zone: str | None = None
    hourly_price: float | None = None
    currency: str = "USD"
    deadman_seconds: float | None = None
    deadman_action: str = "stop"
    instance_request_id: str | None = None
    setup_cache: Path | None = None
    """Where jobs' setup environments are kept for later jobs (default: under work_root)."""
    keep_attempts_hours: float = 0.0
    """How long a finished attempt's folder stays (0: removed once its outputs are stored)."""
    attempt_disk_quota: int = 0
    """Bytes each attempt's folder may hold, as a filesystem of its own (0: no quota)."""

    @property
    def work_root(self) -> Path:
        if self.work_dir is not None:
            return self.work_dir
        if self.run_as or self.run_as_range:
            # The home is the worker's own (often closed to others, as /root is): the job's
            # user could not walk into a folder under it.
            return shared_work_root(self.home_root)
        return self.home_root / "worker-jobs"


SHARED_WORK_PARENT = Path("/var/lib/gpulayer")
"""Where a worker that runs its jobs as other users keeps their folders by default."""


def shared_work_root(home_root: Path) -> Path:
    """The default work dir of a worker whose jobs run as other users: one per worker home
    (two workers on a machine never share one), under a folder they can walk through."""
    import hashlib

    key = hashlib.sha256(str(home_root.resolve()).encode()).hexdigest()[:12]
    return SHARED_WORK_PARENT / f"worker-jobs-{key}"


def prepare_shared_work_root(root: Path) -> None:
    """Make the default work dir and open its path to the jobs' users: walk through, not
    list (each attempt's own folder is what the job's user owns)."""
    import os

    for folder in (root.parent, root):
        folder.mkdir(mode=0o711, exist_ok=True)
        os.chmod(folder, 0o711)


def run_worker(options: WorkerOptions) -> int:
    """Register with the control plane and run what it assigns until SIGTERM/SIGINT (or the
    dead-man switch) stops the worker. Returns the process's exit code. Bad options raise
    UsageError naming the flag, before anything starts."""
    import signal
    import threading

    from gpulayer.worker.deadman import DeadmanSwitch

    runner = _run_as_user(options.run_as)
    uid_pool = _uid_pool(options.run_as_range, runner)
    isolation = "uid_per_attempt" if uid_pool else "shared_uid" if runner else "none"
    action = _checked_options(options, runner, isolation)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    root = options.work_root
    from gpulayer.worker.hardening import make_non_dumpable

    # No job running as this user may read this process's memory (its token, its credential).
    if not make_non_dumpable():
        log.warning("could not make this worker non-dumpable; its jobs may read its memory")
    registration = _registration(options, root, isolation)
    stopped = threading.Event()
    deadman: DeadmanSwitch | None = None

    def contact() -> None:
        if deadman is not None:
            deadman.contact()

    # Held until this process ends (see _prepare_work_root): a local of this frame.
    range_lock = _prepare_work_root(options, root, runner, uid_pool)  # noqa: F841
    agent = _agent(options, registration, root, runner, uid_pool, contact, stopped)
    if options.deadman_seconds is not None:
        deadman = DeadmanSwitch(
            options.deadman_seconds,
            action,
            end_jobs=lambda: agent.stop(cancel_running=True),
            stop_worker=stopped.set,
            worker_name=registration.name,
        )
        deadman.start()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopped.set())
    try:
        worker_id = join(agent, stopped)
    except JoinRefused as refused:
        print(
            f"error: the control plane refused to let this worker join: {refused}", file=sys.stderr
        )
        agent.drain(timeout=0)
        return REFUSED_EXIT_CODE
    if worker_id:
        print(
            f"worker {registration.name} ({worker_id}) joined {options.server_url}",
            file=sys.stderr,
        )
    stopped.wait()
    if agent.revoked.is_set():
        print(REVOKED_LINE, file=sys.stderr)
        agent.stop(cancel_running=True)
        agent.drain(timeout=10)
        return REFUSED_EXIT_CODE
    if deadman is None or not deadman.fired:
        _leave(agent)  # first: no job is placed on it while it stops
    print("stopping: ending running jobs", file=sys.stderr)
    _stop_agent(agent, options, deadman_fired=deadman is not None and deadman.fired)
    return DEADMAN_FIRED_EXIT_CODE if deadman is not None and deadman.fired else 0


# run_worker's steps, functions of their own so that it reads as the worker's life: checked
# options, a prepared work dir, the agent, its join, its stop.


def _checked_options(options: WorkerOptions, runner: RunAs | None, isolation: str) -> DeadmanAction:
    """Raise UsageError naming the flag for options that cannot run; the dead-man action."""
    from gpulayer.errors import UsageError
    from gpulayer.protocol.deadman import DeadmanAction

    if options.require_isolation and isolation == "none":
        raise UsageError(
            f"--require-isolation: {_unisolated_because()}; start it as root with "
            "--run-as-range FIRST-LAST"
        )
    if options.require_isolation and runner is not None:
        raise UsageError(
            f"--require-isolation: {_shared_because(runner.name)}; use --run-as-range "
            "FIRST-LAST for a uid of its own per attempt"
        )
    if options.max_output_file_bytes < 0:
        raise UsageError("--max-output-file-bytes: must be >= 0")
    if not 0 <= options.keep_attempts_hours <= 24 * 366:
        raise UsageError("--keep-attempts: HOURS from 0 to 8784 (a year)")
    if options.attempt_disk_quota:
        from gpulayer.worker.attempt_quota import check_quota_possible

        check_quota_possible()
    if options.kind not in ("remote", "cloud"):
        raise UsageError(f"--kind: remote or cloud, not {options.kind!r}")
    if options.deadman_seconds is not None and options.deadman_seconds <= 0:
        raise UsageError("--deadman-seconds: must be > 0")
    action = DeadmanAction.parse(options.deadman_action)
    return action


def _prepare_work_root(
    options: WorkerOptions, root: Path, runner: RunAs | None, uid_pool: UidPool | None
) -> object:
    """Make the work dir reachable by the jobs' users, warn how isolated the jobs are, and
    for a uid range take its lock, returned: the caller holds it until its process ends, so
    no other worker may take these uids meanwhile."""
    from gpulayer.errors import UsageError

    range_lock: object = None
    if options.work_dir is None and (runner is not None or uid_pool is not None):
        try:
            prepare_shared_work_root(root)
        except OSError as exc:
            raise UsageError(
                f"--work-dir: cannot prepare the default {root} ({exc.strerror}); "
                "choose a --work-dir the jobs' users can reach"
            ) from None
    if runner is not None:
        _check_reachable(root, runner.uid, runner.gid, f"--run-as: {runner.name}")
        print(f"warning: {_shared_because(runner.name)}", file=sys.stderr)
    elif uid_pool is not None:
        _check_reachable(root, -1, -1, "--run-as-range: its uids")
        from gpulayer.worker.range_guard import check_interpreter, lock_range

        # Held until this process ends: no other worker may take these uids meanwhile. Taken
        # before anything runs as them (the check below, the sweep of an earlier life).
        range_lock = lock_range(uid_pool.uids)
        check_interpreter(uid_pool.uids)
    else:
        print(f"warning: {_unisolated_because()}", file=sys.stderr)
    return range_lock


def _agent(
    options: WorkerOptions,
    registration: Registration,
    root: Path,
    runner: RunAs | None,
    uid_pool: UidPool | None,
    contact: Callable[[], None],
    stopped: threading.Event,
) -> WorkerAgent:
    """The worker's agent, talking to the control plane over HTTP with the worker's identity."""
    from gpulayer.protocol.client import ControlClient
    from gpulayer.worker.agent import WorkerAgent
    from gpulayer.worker.http_link import HttpLink
    from gpulayer.worker.identity import FILE_NAME as IDENTITY_FILE_NAME

    return WorkerAgent(
        HttpLink(
            ControlClient(options.server_url, options.token, timeout=30),
            identity_file=options.home_root / IDENTITY_FILE_NAME,
        ),
        registration,
        work_root=root,
        heartbeat_seconds=options.heartbeat_seconds,
        on_contact=contact,
        on_revoked=stopped.set,
        run_as=runner,
        uid_pool=uid_pool,
        max_output_file_bytes=options.max_output_file_bytes,
        setup_cache=options.setup_cache,
        stopped_with_its_machine=bool(options.instance_request_id),
        keep_attempts_seconds=options.keep_attempts_hours * 3600,
        attempt_quota_bytes=options.attempt_disk_quota,
    )


def _leave(agent: WorkerAgent) -> None:
    """Tell the control plane this worker is stopping, before it stops claiming: it is marked
    leaving and placed nothing more. One that cannot be told learns it from the silence."""
    if agent.worker_id is None or agent.revoked.is_set():
        return
    try:
        agent.link.leave(agent.worker_id)
    except Exception as exc:  # an older control plane, or one out of reach
        log.warning("could not tell the control plane this worker is leaving (%s)", exc)


def _stop_agent(agent: WorkerAgent, options: WorkerOptions, *, deadman_fired: bool) -> None:
    """End the running jobs, each with its grace, as the way the worker was stopped says."""
    grace = agent.longest_grace()
    if options.instance_request_id and not deadman_fired:
        # On a rented machine nothing of gpulayer's stops the worker while a job runs: a
        # SIGTERM then is the machine shutting down under it (a spot reclaim, a stop from the
        # cloud's console), and the job's attempt ends as preempted once it saved its work.
        # A Slurm step that launched the worker is ended for other reasons too: Slurm says.
        from gpulayer.worker.batch_system import slurm_job_state, stop_reason

        reason, message = stop_reason(slurm_job_state(os.environ))
        agent.stop(cancel_running=True, reason=reason, message=message)
    else:
        agent.stop(cancel_running=True)
    agent.drain(timeout=30 + grace)


def start_local_worker(link: ControlLink, *, data_dir: Path, work_root: Path) -> WorkerAgent:
    """The embedded control plane's own worker, registered as "local" over an in-process link."""
    from gpulayer.protocol.messages import Registration
    from gpulayer.worker.agent import WorkerAgent
    from gpulayer.worker.probe import probe_capabilities

    capabilities = probe_capabilities(data_dir)
    registration = Registration(
        name=capabilities.hostname or "local",
        kind="local",
        capabilities=capabilities.model_dump(mode="json"),
        worker_id="local",
    )
    # It runs as the user who submits its jobs, on the machine they were submitted on.
    agent = WorkerAgent(link, registration, work_root=work_root, machine_paths=True)
    agent.start()
    return agent


class JoinRefused(Exception):
    """The control plane answered a registration with 401 or 403: waiting will not help."""


def join(agent: WorkerAgent, stopped: threading.Event) -> str | None:
    """Register, waiting out a control plane that is not up yet (until stopped). Raises
    JoinRefused when the control plane refuses the token (retrying would never end)."""
    from gpulayer.backoff import WORKER_JOIN
    from gpulayer.errors import ForbiddenError
    from gpulayer.protocol.client import Unauthorized

    def note(state: object) -> None:
        outcome = getattr(state, "outcome", None)
        log.warning("cannot join yet (%s); retrying", outcome.exception() if outcome else "?")

    try:
        for attempt in WORKER_JOIN.retrying(
            stop_event=stopped,
            retry_if=lambda exc: not isinstance(exc, (Unauthorized, ForbiddenError)),
            before_sleep=note,
        ):
            with attempt:
                if stopped.is_set():
                    return None
                return agent.start()
    except (Unauthorized, ForbiddenError) as exc:
        raise JoinRefused(str(exc)) from None
    except Exception:  # stopped while the control plane was still away
        return None
    return None


def _unisolated_because() -> str:
    if os.geteuid() == 0:
        return (
            "this worker runs as root without --run-as or --run-as-range: its jobs run as "
            "root and can read its credential and act as this worker"
        )
    return (
        "this worker does not run as root: its jobs run as its own user and can read its "
        "credential and act as this worker"
    )


def _shared_because(user: str) -> str:
    return (
        f"every job of this worker runs as the one user {user} (--run-as): its jobs can reach "
        "each other (read another's /proc/PID/environ and its secrets, write into its folders)"
    )


def _registration(options: WorkerOptions, root: Path, isolation: str) -> Registration:
    import socket

    from gpulayer.protocol.messages import Registration
    from gpulayer.worker.netif import address_towards
    from gpulayer.worker.probe import probe_capabilities

    capabilities = probe_capabilities(root.parent if root.parent.exists() else options.home_root)
    capabilities = capabilities.model_copy(
        update={
            "provider": options.provider,
            "region": options.region,
            "zone": options.zone,
            "hourly_price": options.hourly_price,
            "currency": options.currency,
            "address": options.address or address_towards(options.server_url),
            "isolation": isolation,
        }
    )
    return Registration(
        name=options.name or capabilities.hostname or socket.gethostname(),
        kind="cloud" if options.kind == "cloud" else "remote",
        labels=dict(options.labels),
        capabilities=capabilities.model_dump(mode="json"),
        instance_request_id=options.instance_request_id or None,
    )


def _run_as_user(name: str | None) -> RunAs | None:
    from gpulayer.errors import UsageError
    from gpulayer.worker.process import RunAs

    if name is None:
        return None
    if os.geteuid() != 0:
        raise UsageError("--run-as: only a worker running as root can run jobs as another user")
    try:
        return RunAs.lookup(name)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _uid_pool(text: str | None, runner: RunAs | None) -> UidPool | None:
    from gpulayer.errors import UsageError
    from gpulayer.worker.identities import UidPool, UidRange, users_inside

    if text is None:
        return None
    if runner is not None:
        raise UsageError("--run-as-range: give either --run-as or --run-as-range, not both")
    try:
        uids = UidRange.parse(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if os.geteuid() != 0:
        raise UsageError("--run-as-range: only a worker running as root can run jobs as other uids")
    taken = users_inside(uids)
    if taken:
        raise UsageError(
            f"--run-as-range: {text} holds accounts of this machine ({', '.join(taken[:3])}); "
            "choose uids no account has"
        )
    return UidPool(uids)


def _check_reachable(root: Path, uid: int, gid: int, who: str) -> None:
    """The job's user must be able to walk down to the work dir the worker makes for it."""
    import stat

    from gpulayer.errors import UsageError

    for folder in [*reversed(root.resolve().parents)]:
        mode = folder.stat()
        others = mode.st_mode & stat.S_IXOTH
        owned = mode.st_uid == uid and mode.st_mode & stat.S_IXUSR
        grouped = mode.st_gid == gid and mode.st_mode & stat.S_IXGRP
        if not (others or owned or grouped):
            raise UsageError(
                f"{who} cannot reach --work-dir {root} ({folder} is closed to it); "
                "choose a --work-dir it can reach"
            )
