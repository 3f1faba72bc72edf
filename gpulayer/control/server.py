"""`gpulayer server`: the team control plane, over SQLite or PostgreSQL, for remote workers."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from gpulayer.control.paths import HomeLayout

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


def run_server(
    layout: HomeLayout,
    *,
    host: str,
    port: int,
    database_url: str | None,
    heartbeat_timeout: float,
    max_log_bytes: int | None = None,
    announce: bool = True,
) -> None:
    import uvicorn

    from gpulayer.control.api import create_app
    from gpulayer.control.provisioner import attach_provisioner
    from gpulayer.control.schedule_firing import attach_schedules
    from gpulayer.control.service import ControlService
    from gpulayer.control.store import Store

    layout.ensure()
    url = (
        database_url
        or os.environ.get("GPULAYER_DATABASE_URL")
        or f"sqlite:///{layout.root / 'server.db'}"
    )
    store = Store(url, max_log_bytes=max_log_bytes)
    generated = ensure_admin_token(store, layout)
    if generated and announce:
        print(
            f"admin token (shown once, also in {admin_token_file(layout)}): {generated}", flush=True
        )

    from gpulayer.control.auth import TokenAuthority

    authenticate = TokenAuthority(store)

    service = ControlService(store, layout, heartbeat_timeout=heartbeat_timeout)
    provisioner = attach_provisioner(service, control_port=port)
    firing = attach_schedules(service)
    app = create_app(service, authenticate, embedded=False)
    stop = threading.Event()

    def maintenance() -> None:
        while not stop.wait(min(1.0, heartbeat_timeout / 4)):
            try:
                service.sweep_lost_workers()
                service.dispatch()
            except Exception:
                log.exception("maintenance pass failed")

    threading.Thread(target=maintenance, name="gpulayer-maintenance", daemon=True).start()
    if announce:
        print(f"gpulayer server listening on http://{host}:{port} ({_safe_url(url)})", flush=True)
    started = time.monotonic()
    try:
        uvicorn.run(
            app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=2,  # long polls would otherwise hold shutdown for their wait
        )
    finally:
        stop.set()
        firing.stop()
        provisioner.stop()
        store.close()
        log.info("server stopped after %.0f s", time.monotonic() - started)


def _safe_url(url: str) -> str:
    """The database URL without its password, for printing."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
