"""The embedded local control plane: started on demand, loopback only, exits when idle.

It holds the store, runs the local worker, and outlives the CLI that started it, which is what
lets a detached job finish and be recorded after `gpulayer submit -d` has returned.

The local worker is handed in (see gpulayer.embedded, which assembles the two and is what
`python -m gpulayer.embedded` runs), so the control plane never imports the worker; clients
find the daemon through server.json in the home.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpulayer.control.paths import HomeLayout
from gpulayer.control.tokens import ensure_token

if TYPE_CHECKING:
    from gpulayer.control.service import ControlService
    from gpulayer.control.store import Store

log = logging.getLogger("gpulayer.daemon")


class LocalWorker(Protocol):
    """What the daemon needs of its local worker: how busy it is, and how to stop it."""

    @property
    def running(self) -> int: ...

    def stop(self, *, cancel_running: bool = True) -> None: ...


StartWorker = Callable[["ControlService", HomeLayout], LocalWorker]
"""Starts the local worker on the service (over an in-process link) once the store is up."""

DEFAULT_IDLE_SECONDS = 300.0


def local_tokens(admin_token: str, store: Any) -> Any:
    """The local admin token (from the 0600 file), plus join and worker tokens for the cloud
    workers that reach this control plane through SSH tunnels."""
    from gpulayer.control.auth import TokenAuthority

    return TokenAuthority(store, local_admin_token=admin_token)


def _acquire_lock(path: Path) -> Any:
    import fcntl

    handle = path.open("a+")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def _server_info(url: str, idle_seconds: float) -> dict[str, Any]:
    """What server.json says: where to call, and what code and environment this daemon runs
    with, so a later command can tell whether it is out of date (see connect.py)."""
    from gpulayer.control.environment import daemon_environment
    from gpulayer.control.fingerprint import code_fingerprint

    return {
        "url": url,
        "pid": os.getpid(),
        "started": time.time(),
        "idle_seconds": idle_seconds,
        "code": code_fingerprint(),
        "env": daemon_environment(),
    }


def _write_server_file(layout: HomeLayout, info: dict[str, Any]) -> None:
    temporary = layout.server_file.with_suffix(".tmp")
    temporary.write_text(json.dumps(info))
    os.chmod(temporary, 0o600)
    temporary.replace(layout.server_file)


def _remove_server_file(layout: HomeLayout) -> None:
    try:
        if json.loads(layout.server_file.read_text()).get("pid") == os.getpid():
            layout.server_file.unlink()
    except (OSError, ValueError):
        pass


def serve(layout: HomeLayout, *, idle_seconds: float, start_worker: StartWorker) -> int:
    layout.ensure()
    lock = _acquire_lock(layout.daemon_lock)
    if lock is None:
        log.info("another local control plane holds %s", layout.daemon_lock)
        return 0

    # Listen before the heavy imports: a client that connects meanwhile waits in the backlog
    # and is answered as soon as the app is up, instead of polling for it.
    # Naming IPPROTO_TCP lets asyncio set TCP_NODELAY on accepted connections; without it
    # every keep-alive request waits ~40 ms on Nagle and delayed ACKs.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    token = ensure_token(layout.token_file)
    info = _server_info(f"http://127.0.0.1:{port}", idle_seconds)
    _write_server_file(layout, info)
    try:
        return _run(layout, listener, token, idle_seconds, info, start_worker)
    finally:
        _remove_server_file(layout)
        lock.close()


def _run(
    layout: HomeLayout,
    listener: socket.socket,
    token: str,
    idle_seconds: float,
    info: dict[str, Any],
    start_worker: StartWorker,
) -> int:
    import uvicorn

    from gpulayer.control.api import create_app
    from gpulayer.control.cloud_attach import ProviderCloud
    from gpulayer.control.local_admin import LocalAdmin, add_local_routes
    from gpulayer.control.schedule_firing import attach_schedules
    from gpulayer.control.service import ControlService
    from gpulayer.control.store import Store

    store = Store(f"sqlite:///{layout.database}", max_log_bytes=_max_log_bytes())
    cloud = ProviderCloud(layout.root, store)
    service = ControlService(store, layout, cloud=cloud)
    agent = start_worker(service, layout)
    lifecycle = cloud.start_lifecycle(service.cloud_moves, listener.getsockname()[1])
    firing = attach_schedules(service)
    exit_requested = threading.Event()
    admin = LocalAdmin(
        service,
        info=info,
        idle_seconds=idle_seconds,
        request_exit=exit_requested.set,
        write_info=lambda data: _write_server_file(layout, data),
        in_flight=lambda: _in_flight(store, agent.running),
    )
    app = create_app(
        service,
        local_tokens(token, store),
        embedded=True,
        extra_routes=lambda app, auth: add_local_routes(app, admin, auth),
        schedules=firing.schedules,
    )
    # Long polls (logs -f, idle workers) would hold a graceful shutdown for their full wait.
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=2
    )
    server = uvicorn.Server(config)

    def watchdog() -> None:
        while not server.should_exit:
            if exit_requested.wait(1.0):  # a stop asked for over the API
                server.should_exit = True
                break
            try:
                service.workers.sweep_lost_workers()  # cloud workers reach us through SSH tunnels
                service.dispatcher.dispatch()
                idle_for = time.monotonic() - service.last_call
                busy = (
                    service.jobs.live_jobs()
                    or agent.running
                    or firing.schedules.active_count()
                    or lifecycle.has_live_instances()  # teardown still to finish
                )
                if idle_for > idle_seconds and not busy:
                    log.info("idle for %.0f s with no live job or schedule; exiting", idle_for)
                    server.should_exit = True
            except Exception:
                log.exception("watchdog pass failed")

    threading.Thread(target=watchdog, name="gpulayer-watchdog", daemon=True).start()
    try:
        server.run(sockets=[listener])
    finally:
        firing.stop()
        lifecycle.stop()
        agent.stop(cancel_running=True)
        store.close()
    return 0


def _in_flight(store: Store, local_attempts: int) -> list[str]:
    """What a stop waits for: live cloud instances (their teardown) and local attempts."""
    found = [
        f"instance {i.request_id} of job {i.job_id}" for i in store.list_instances(live_only=True)
    ]
    return found + ([f"{local_attempts} local attempt(s)"] if local_attempts else [])


def _max_log_bytes() -> int | None:
    from gpulayer.control.log_cap import MAX_LOG_BYTES_ENV, parse_byte_size

    configured = os.environ.get(MAX_LOG_BYTES_ENV)
    return parse_byte_size(configured, MAX_LOG_BYTES_ENV) if configured else None
