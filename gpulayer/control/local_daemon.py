"""The on-demand local control plane seen from a command: find it, keep it current, stop it.

A daemon started earlier may run other code (gpulayer upgraded, its checkout edited, a plugin
installed since) or another environment (GPULAYER_* changed in the shell). A command restarts
it when no job is live; while jobs are live it says so once and leaves it running, since a
restart would end them. GPULAYER_* variables read per job are handed to the running daemon.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpulayer.control.paths import HomeLayout
from gpulayer.control.tokens import read_token
from gpulayer.errors import ControlPlaneError, NotFoundError
from gpulayer.protocol.client import ControlClient

# What the local control plane keeps of the environment of the `submit` that starts it: what
# a process needs to run at all, gpulayer's own settings, and the cloud SDKs' credential chains
# that its provisioning reads. Everything else (another shell's secrets, unrelated keys) stays
# out of its /proc environ; each local job gets its own submitter's environment, in memory.
_DAEMON_NAMES = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ",
        "TMPDIR", "TEMP", "TMP", "LD_LIBRARY_PATH",
        "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX",
        "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_RUNTIME_DIR",
        "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
        "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
        # Google Cloud Storage's endpoint (AWS's, AWS_ENDPOINT_URL_S3, is kept with AWS_).
        "STORAGE_EMULATOR_HOST",
    }
)  # fmt: skip
_DAEMON_PREFIXES = ("LC_", "GPULAYER_", "AWS_", "GOOGLE_", "CLOUDSDK_")
_CLIENT_ONLY = frozenset({"GPULAYER_TOKEN", "GPULAYER_SERVER"})


def daemon_environment(environ: Mapping[str, str], home_root: str) -> dict[str, str]:
    """The scrubbed environment the local control plane starts with."""
    kept = {
        name: value
        for name, value in environ.items()
        if (name in _DAEMON_NAMES or name.startswith(_DAEMON_PREFIXES)) and name not in _CLIENT_ONLY
    }
    kept["GPULAYER_HOME"] = home_root
    return kept


def check_daemon_settings() -> None:
    """Refuse a bad setting here, naming it, rather than as a daemon that failed to start."""
    from gpulayer.control.log_cap import MAX_LOG_BYTES_ENV, parse_byte_size

    configured = os.environ.get(MAX_LOG_BYTES_ENV)
    if configured:
        parse_byte_size(configured, MAX_LOG_BYTES_ENV)


START_TIMEOUT_SECONDS = 20.0
STOP_TIMEOUT_SECONDS = 30.0
LIVE_STATES = ["queued", "provisioning", "running"]


@dataclass
class RunningDaemon:
    client: ControlClient
    info: dict[str, Any]

    @property
    def pid(self) -> int:
        return int(self.info.get("pid") or 0)

    def live_jobs(self) -> list[str]:
        try:
            return list(self.client.request("GET", "/v1/local")["live_jobs"])
        except NotFoundError:  # a daemon from before these routes
            return [job["id"] for job in self.client.jobs(limit=1000, states=LIVE_STATES)]


@dataclass
class Staleness:
    """Why a running daemon should restart, and what it can take without one."""

    restart: list[str] = field(default_factory=list)
    refused: dict[str, str | None] = field(default_factory=dict)
    """Changed variables read only at start (they need a restart)."""
    next_job: dict[str, str | None] = field(default_factory=dict)


def find_running(layout: HomeLayout) -> RunningDaemon | None:
    try:
        info = json.loads(layout.server_file.read_text())
        token = read_token(layout.token_file)
    except (OSError, ValueError):
        return None
    if not token or not isinstance(info, dict) or "url" not in info:
        return None
    client = ControlClient(info["url"], token)
    try:
        client.health(timeout=2.0)
    except Exception:
        return None
    return RunningDaemon(client, info)


def staleness(info: dict[str, Any]) -> Staleness:
    from gpulayer.control.environment import compare, daemon_environment
    from gpulayer.control.fingerprint import what_changed

    found = Staleness(restart=what_changed(info.get("code")))
    if "env" not in info:
        return found
    diff = compare(info["env"], daemon_environment())
    found.refused = diff.restart
    found.next_job = diff.next_job
    return found


class _NotUpYet(Exception):
    """The daemon is starting but does not answer yet."""


def start(layout: HomeLayout) -> ControlClient:
    from gpulayer.backoff import CONTROL_PLANE_START  # tenacity: only on this slower path

    check_daemon_settings()
    log = layout.daemon_log.open("ab")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "gpulayer.embedded"],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,  # a Ctrl-C in the terminal must not reach the daemon
        close_fds=True,
        env=daemon_environment(os.environ, str(layout.root)),
    )
    log.close()
    try:
        for attempt in CONTROL_PLANE_START.retrying(
            retry_on=(_NotUpYet,), give_up_after=START_TIMEOUT_SECONDS
        ):
            with attempt:
                running = find_running(layout)
                if running is not None:
                    return running.client
                if daemon.poll() in (None, 0):
                    raise _NotUpYet  # exit 0: another daemon won the lock and is starting
    except _NotUpYet:
        pass
    tail = _tail(layout.daemon_log.read_bytes().decode(errors="replace"))
    raise ControlPlaneError(f"the local control plane did not start; {layout.daemon_log}: {tail}")


def stop(
    running: RunningDaemon,
    *,
    force: bool,
    wait_for_jobs: bool,
    on_wait: Callable[[list[str], list[str]], None] | None = None,
) -> bool:
    """Stop the daemon. Without force it stops only once no job is live: with wait_for_jobs
    it waits for that (calling on_wait with the live jobs and the calls in flight now and
    then), else it returns
    False at once. True once the daemon's process has ended."""
    while True:
        try:
            answer = running.client.request("POST", "/v1/local/stop", {"force": force})
        except NotFoundError:  # an older daemon: no stop route, so a signal once it is idle
            live = running.live_jobs()
            answer = {"stopping": not live, "live_jobs": live}
            if not live:
                _signal(running.pid)
        if answer.get("stopping"):
            break
        if not wait_for_jobs:
            return False
        if on_wait is not None:
            on_wait(list(answer.get("live_jobs") or []), list(answer.get("in_flight") or []))
        time.sleep(1.0)
    timeout = STOP_TIMEOUT_SECONDS + (120.0 if force else 0.0)
    if not wait_for_exit(running.pid, timeout):
        raise ControlPlaneError(
            f"the local control plane (pid {running.pid}) did not exit within {timeout:.0f} s"
        )
    return True


def wait_for_exit(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return not _alive(pid)


def _signal(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)


def _alive(pid: int) -> bool:
    from gpulayer.procs import is_alive

    return pid > 0 and is_alive(pid)


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(empty)"


def notice_once(layout: HomeLayout, running: RunningDaemon, text: str) -> None:
    """Print ``text`` unless this very notice was printed for this daemon already."""
    marker = layout.root / "restart-notice"
    key = f"{running.pid}:{running.info.get('started')}:{text}"
    try:
        if marker.read_text() == key:
            return
    except OSError:
        pass
    print(f"gpulayer: {text}", file=sys.stderr)
    with contextlib.suppress(OSError):
        marker.write_text(key)


def current(layout: HomeLayout) -> ControlClient:
    """A client of a daemon running this code and environment: the running one when it is
    current (or cannot restart now), else a fresh one."""
    running = find_running(layout)
    if running is None:
        return start(layout)
    found = staleness(running.info)
    if found.restart or found.refused:
        # The daemon refuses while a job is live or work outlives one (a teardown).
        if stop(running, force=False, wait_for_jobs=False):
            why = "; ".join(found.restart + [f"{name} changed" for name in found.refused])
            print(f"gpulayer: restarted the local control plane ({why})", file=sys.stderr)
            return start(layout)
        live = running.live_jobs()
        jobs = (
            f"{len(live)} live job{'s' if len(live) != 1 else ''}"
            if live
            else "work in flight (a teardown)"
        )
        if found.restart and live:
            notice_once(
                layout,
                running,
                f"the local control plane runs other code ({'; '.join(found.restart)}); it "
                f"restarts by itself once its {jobs} end (gpulayer server restart waits for them)",
            )
        for name, value in found.refused.items():
            shown = " unset" if value is None else f"={value}"
            print(
                f"gpulayer: {name}{shown} is not applied: the local control plane must restart "
                f"for it and has {jobs} (gpulayer server restart waits for them)",
                file=sys.stderr,
            )
    if found.next_job:
        # An older daemon lacks the route; its fingerprint has it restart once idle.
        with contextlib.suppress(NotFoundError):
            running.client.request("POST", "/v1/local/environment", {"env": found.next_job})
    return running.client
