"""`gpulayer server`: the team control plane, over SQLite or PostgreSQL, for remote workers."""

from __future__ import annotations

import errno
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gpulayer.control.paths import HomeLayout
from gpulayer.errors import UsageError

if TYPE_CHECKING:
    from gpulayer.control.auth import TokenAuthority
    from gpulayer.control.output_uploads import OutputLimits
    from gpulayer.control.service import ControlService
    from gpulayer.control.store import Store

log = logging.getLogger("gpulayer.server")

DEFAULT_PORT = 8765


def admin_token_file(layout: HomeLayout) -> Path:
    return layout.root / "server-token"


def ensure_admin_token(store: object, layout: HomeLayout) -> str | None:
    """Create the admin token on first start: GPULAYER_TOKEN if set, else a new one.

    A chosen token is kept as a salted scrypt digest, a generated one as its SHA-256.
    Returns a newly generated token (to show once), or None when one existed or was preset.
    """
    from sqlalchemy.exc import IntegrityError

    from gpulayer.control.auth import issue_token, keep_chosen_token
    from gpulayer.control.store import Store

    assert isinstance(store, Store)
    if store.has_admin_token():
        return None
    preset = os.environ.get("GPULAYER_TOKEN")
    try:
        if preset:
            keep_chosen_token(store, preset, "admin", "initial")
            return None
        token, _ = issue_token(store, "admin", "initial")
    except IntegrityError:
        return None  # another server process on this database made it at the same moment
    path = admin_token_file(layout)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    return token


def _output_limits(files: int | None, size: str | None, ratio: float | None) -> OutputLimits:
    """The flags over GPULAYER_MAX_OUTPUT_* over the defaults; UsageError naming the flag."""
    import dataclasses

    from gpulayer.control.log_cap import parse_byte_size
    from gpulayer.control.output_uploads import OutputLimits

    limits = OutputLimits.from_environment()
    if files is not None:
        limits = dataclasses.replace(limits, max_files=files)
    if size is not None:
        limits = dataclasses.replace(limits, max_bytes=parse_byte_size(size, "--max-output-bytes"))
    if ratio is not None:
        limits = dataclasses.replace(limits, max_ratio=ratio)
    return limits.checked()


def run_server(
    layout: HomeLayout,
    *,
    host: str,
    port: int,
    database_url: str | None,
    heartbeat_timeout: float,
    max_log_bytes: int | None = None,
    max_output_files: int | None = None,
    max_output_bytes: str | None = None,
    max_output_ratio: float | None = None,
    announce: bool = True,
) -> None:
    import uvicorn

    from gpulayer.control.api import create_app
    from gpulayer.control.cloud_attach import ProviderCloud
    from gpulayer.control.schedule_firing import attach_schedules
    from gpulayer.control.service import ControlService
    from gpulayer.control.store import Store

    limits = _output_limits(max_output_files, max_output_bytes, max_output_ratio)
    # Bound first: an address in use is one line before anything is said or started.
    listener = _listen(host, port)
    layout.ensure()
    url = (
        database_url
        or os.environ.get("GPULAYER_DATABASE_URL")
        or f"sqlite:///{layout.root / 'server.db'}"
    )
    store = Store(url, max_log_bytes=max_log_bytes)
    authenticate = _authority(store, layout, announce=announce)
    cloud = ProviderCloud(layout.root, store)
    service = ControlService(
        store,
        layout,
        heartbeat_timeout=heartbeat_timeout,
        cloud=cloud,
        default_target="remote",  # no local worker here: jobs go to the team's workers
        output_limits=limits,
    )
    lifecycle = cloud.start_lifecycle(service.cloud_moves, port)
    firing = attach_schedules(service)
    app = create_app(service, authenticate, embedded=False, schedules=firing.schedules)
    stop = threading.Event()
    stop_dispatcher = service.dispatcher.start()
    _start_maintenance(service, stop, heartbeat_timeout)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=2,  # long polls would otherwise hold shutdown for their wait
    )
    if announce:  # the socket listens already: a client may call at once
        print(f"gpulayer server listening on http://{host}:{port} ({_safe_url(url)})", flush=True)
    started = time.monotonic()
    try:
        uvicorn.Server(config).run(sockets=[listener])
    finally:
        listener.close()
        stop.set()
        stop_dispatcher()
        firing.stop()
        lifecycle.stop()
        store.close()
        log.info("server stopped after %.0f s", time.monotonic() - started)


def _authority(store: Store, layout: HomeLayout, *, announce: bool) -> TokenAuthority:
    """The server's token check, with an admin token made (and shown once) on first start."""
    from gpulayer.control.auth import TokenAuthority

    generated = ensure_admin_token(store, layout)
    if generated and announce:
        print(
            f"admin token (shown once, also in {admin_token_file(layout)}): {generated}", flush=True
        )
    authenticate = TokenAuthority(store)
    chosen = os.environ.get("GPULAYER_TOKEN")
    if chosen:
        authenticate.trust(chosen)  # its one scrypt now, so no call and no wrong token waits
    return authenticate


def _start_maintenance(
    service: ControlService, stop: threading.Event, heartbeat_timeout: float
) -> None:
    """Sweep lost workers, dispatch and wake unclaimed work until ``stop`` is set."""

    def maintenance() -> None:
        while not stop.wait(min(1.0, heartbeat_timeout / 4)):
            try:
                if service.serving:  # before that, no worker could have reached us
                    service.workers.sweep_lost_workers()
                service.dispatcher.dispatch(quiet=True)
                service.changes.wake_unclaimed()
            except Exception:
                log.exception("maintenance pass failed")

    threading.Thread(target=maintenance, name="gpulayer-maintenance", daemon=True).start()


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port; a UsageError naming the address when it is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
        listener.listen(2048)
    except OSError as exc:
        listener.close()
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(f"--port: {host}:{port} is already in use") from None
        raise UsageError(f"--host: cannot listen on {host}:{port}: {exc.strerror}") from None
    listener.set_inheritable(True)
    return listener


def _safe_url(url: str) -> str:
    """The database URL without its password, for printing."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
