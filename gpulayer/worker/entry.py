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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import threading

    from gpulayer.protocol.messages import Registration
    from gpulayer.worker.agent import ControlLink, WorkerAgent
    from gpulayer.worker.process import RunAs

log = logging.getLogger("gpulayer.worker")

DEADMAN_FIRED_EXIT_CODE = 3


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
    max_output_file_bytes: int = 10 * 1024**3
    provider: str | None = None
    region: str | None = None
    zone: str | None = None
    hourly_price: float | None = None
    currency: str = "USD"
    deadman_seconds: float | None = None
    deadman_action: str = "stop"
    instance_request_id: str | None = None

    @property
    def work_root(self) -> Path:
        return self.work_dir or self.home_root / "worker-jobs"


def run_worker(options: WorkerOptions) -> int:
    """Register with the control plane and run what it assigns until SIGTERM/SIGINT (or the
    dead-man switch) stops the worker. Returns the process's exit code. Bad options raise
    UsageError naming the flag, before anything starts."""
    import signal
    import threading

    from gpulayer.errors import UsageError
    from gpulayer.protocol.client import ControlClient
    from gpulayer.protocol.deadman import DeadmanAction
    from gpulayer.worker.agent import WorkerAgent
    from gpulayer.worker.deadman import DeadmanSwitch
    from gpulayer.worker.http_link import HttpLink

    runner = _run_as_user(options.run_as)
    if options.max_output_file_bytes < 0:
        raise UsageError("--max-output-file-bytes: must be >= 0")
    if options.kind not in ("remote", "cloud"):
        raise UsageError(f"--kind: remote or cloud, not {options.kind!r}")
    if options.deadman_seconds is not None and options.deadman_seconds <= 0:
        raise UsageError("--deadman-seconds: must be > 0")
    action = DeadmanAction.parse(options.deadman_action)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    root = options.work_root
    registration = _registration(options, root)
    stopped = threading.Event()
    deadman: DeadmanSwitch | None = None

    def contact() -> None:
        if deadman is not None:
            deadman.contact()

    if runner is not None:
        _check_reachable(root, runner)
    elif os.geteuid() == 0:
        print(
            "warning: this worker runs as root without --run-as: its jobs can read its "
            "credential and act as this worker",
            file=sys.stderr,
        )
    agent = WorkerAgent(
        HttpLink(ControlClient(options.server_url, options.token, timeout=30)),
        registration,
        work_root=root,
        heartbeat_seconds=options.heartbeat_seconds,
        on_contact=contact,
        run_as=runner,
        max_output_file_bytes=options.max_output_file_bytes,
    )
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
    worker_id = join(agent, stopped)
    if worker_id:
        print(
            f"worker {registration.name} ({worker_id}) joined {options.server_url}",
            file=sys.stderr,
        )
    stopped.wait()
    print("stopping: ending running jobs", file=sys.stderr)
    agent.stop(cancel_running=True)
    agent.drain(timeout=30)
    return DEADMAN_FIRED_EXIT_CODE if deadman is not None and deadman.fired else 0


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
    agent = WorkerAgent(link, registration, work_root=work_root)
    agent.start()
    return agent


def join(agent: WorkerAgent, stopped: threading.Event) -> str | None:
    """Register, waiting out a control plane that is not up yet (until stopped)."""
    from gpulayer.backoff import WORKER_JOIN

    def note(state: object) -> None:
        outcome = getattr(state, "outcome", None)
        log.warning("cannot join yet (%s); retrying", outcome.exception() if outcome else "?")

    try:
        for attempt in WORKER_JOIN.retrying(stop_event=stopped, before_sleep=note):
            with attempt:
                if stopped.is_set():
                    return None
                return agent.start()
    except Exception:  # stopped while the control plane was still away
        return None
    return None


def _registration(options: WorkerOptions, root: Path) -> Registration:
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


def _check_reachable(root: Path, runner: RunAs) -> None:
    """The job's user must be able to walk down to the work dir the worker makes for it."""
    import stat

    from gpulayer.errors import UsageError

    for folder in [*reversed(root.resolve().parents)]:
        mode = folder.stat()
        others = mode.st_mode & stat.S_IXOTH
        owned = mode.st_uid == runner.uid and mode.st_mode & stat.S_IXUSR
        grouped = mode.st_gid == runner.gid and mode.st_mode & stat.S_IXGRP
        if not (others or owned or grouped):
            raise UsageError(
                f"--run-as: {runner.name} cannot reach --work-dir {root} ({folder} is closed "
                "to it); choose a --work-dir it can reach"
            )
