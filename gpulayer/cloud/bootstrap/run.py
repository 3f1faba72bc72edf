"""Turn a machine reachable over SSH into a worker of this control plane.

Steps, all within one time budget: ask the host's python for its version and platform (and
refuse a host the wheelhouse does not fit before anything is installed) and whether the worker's
install for this machine and version is there and sound (see :mod:`.worker_install`); when it
is not, upload the wheels the host does not already have (same name, size and SHA-256) and
build it. Then upload the bootstrap script and the join token, open a reverse tunnel from the
host's loopback to the control plane, and run the script, which links the install as the job
dir's venv and starts the worker detached. The call returns once the worker has joined; while
it waits, a quiet stretch of a few seconds is filled with a line saying what it waits for.

The join token travels only as a file (0600, in a 0700 directory) that the script reads into
the worker's environment and then deletes: it never appears in a command line, in output or
in an error. A failed bootstrap stops whatever it started on the host, removes the install
dir and closes the tunnel before raising.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import secrets
import shlex
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpulayer.cloud.bootstrap.commands import (
    KILL_AFTER_SECONDS,
    PHASE_PREFIX,
    SCRIPT_NAME,
    STOP_GRACE_SECONDS,
    TOKEN_NAME,
    install_command,
    missing_wheels,
    parse_probe,
    phase_field,
    probe_command,
    prune_wheelhouses_command,
    remove_command,
    stop_command,
)
from gpulayer.cloud.bootstrap.errors import (
    BootstrapError,
    BootstrapPlanError,
    BootstrapTimeout,
    HostIncompatible,
)
from gpulayer.cloud.bootstrap.output import Lines, Ticker
from gpulayer.cloud.bootstrap.plan import BootstrapPlan, default_wheelhouse_dir, validate_plan
from gpulayer.cloud.bootstrap.remote import RemoteWorker, run_collect
from gpulayer.cloud.bootstrap.worker_install import install_worker_command, worker_probe_args
from gpulayer.errors import UsageError

if TYPE_CHECKING:
    from gpulayer.cloud.bootstrap.commands import HostPython
    from gpulayer.cloud.wheelhouse import Wheelhouse
    from gpulayer.ssh.session import SshSession
    from gpulayer.ssh.tunnel import ReverseTunnel

log = logging.getLogger("gpulayer.bootstrap")


def bootstrap_worker(
    session: SshSession,
    plan: BootstrapPlan,
    wheelhouse: Wheelhouse,
    on_output: Callable[[str], None],
    timeout: float,
) -> RemoteWorker:
    """Install and start a worker on ``session``'s host; returns once it joined (see the
    module docstring). Raises BootstrapPlanError for a bad plan, HostIncompatible,
    BootstrapTimeout or BootstrapError otherwise, after undoing what it did on the host."""
    from gpulayer.ssh.errors import SshCommandTimeout, SshError
    from gpulayer.ssh.tunnel import open_reverse_tunnel

    validate_plan(plan)
    if not timeout > 0:
        raise BootstrapPlanError(f"timeout: must be > 0 seconds, got {timeout!r}")
    deadline = time.monotonic() + timeout
    lines = Lines(on_output, plan.worker_token)
    wheelhouse_dir = plan.wheelhouse_dir or default_wheelhouse_dir(plan.install_dir, wheelhouse.key)
    target = session.target
    tunnel: ReverseTunnel | None = None
    touched = False

    def remaining() -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BootstrapTimeout(f"bootstrap on {target} ran past {timeout:g}s", lines.tail)
        return left

    def phase(text: str) -> None:
        lines.emit(f"{PHASE_PREFIX} {text}")

    with Ticker(lines):
        try:
            phase(f"probing python ({plan.python}) on {target}")
            # From here on the host may hold something of ours, even if this very call times out.
            touched = True
            host = _probe_host(session, plan, wheelhouse, wheelhouse_dir, lines, remaining)
            worker_venv = _worker_install(
                session, plan, wheelhouse, wheelhouse_dir, host, lines, phase, remaining
            )
            _upload_files(session, plan, remaining)
            bind = plan.tunnel_address or "127.0.0.1"
            tunnel = open_reverse_tunnel(session, plan.control_plane_port, remote_bind=bind)
            phase(f"tunnel: host {bind}:{tunnel.remote_port} -> control plane")
            return _start_worker(
                session, plan, wheelhouse, tunnel, worker_venv, lines, timeout, remaining
            )
        except BaseException as exc:
            lines.flush()
            if touched:
                _undo(session, plan.install_dir, lines)
            if tunnel is not None:
                tunnel.close()
            if isinstance(exc, SshCommandTimeout):
                raise BootstrapTimeout(
                    f"bootstrap on {target} ran past {timeout:g}s", list(lines.tail)
                ) from exc
            if isinstance(exc, SshError) and not isinstance(exc, UsageError):
                raise BootstrapError(f"bootstrap on {target}: {exc}", list(lines.tail)) from exc
            raise


# bootstrap_worker's steps of their own, so the function reads as the sequence it runs.


def _probe_host(
    session: SshSession,
    plan: BootstrapPlan,
    wheelhouse: Wheelhouse,
    wheelhouse_dir: str,
    lines: Lines,
    remaining: Callable[[], float],
) -> HostPython:
    """The host's python, as its probe says; HostIncompatible when the wheelhouse does not
    fit it (before anything is installed)."""
    command = probe_command(
        plan.python, plan.install_dir, wheelhouse_dir, worker_probe_args(plan, wheelhouse)
    )
    probe = session.run(command, timeout=remaining())
    host = parse_probe(probe.stdout + probe.stderr, plan.python)
    glibc = f", glibc {host.glibc}" if host.glibc else ""
    lines.emit(
        f"{PHASE_PREFIX} host python {host.version} ({host.implementation}, {host.platform}{glibc})"
    )
    why = wheelhouse.incompatibility(
        host.version, host.platform, glibc=host.glibc, implementation=host.implementation
    )
    if why is not None:
        raise HostIncompatible(why, lines.tail)
    return host


def _worker_install(
    session: SshSession,
    plan: BootstrapPlan,
    wheelhouse: Wheelhouse,
    wheelhouse_dir: str,
    host: HostPython,
    lines: Lines,
    phase: Callable[[str], None],
    remaining: Callable[[], float],
) -> str:
    """The venv of the worker's install for this machine and version: the one the probe
    verified, else one built now (from wheels sent only then). Returns its path."""
    found = host.worker
    if found is None:
        raise BootstrapError("the host's probe said nothing of the worker's install", lines.tail)
    if found.valid:
        phase(f"worker: reusing its verified install {found.directory}")
        return found.venv
    phase(f"worker: installing it once for this machine and version ({found.why})")
    _upload_wheels(session, wheelhouse, wheelhouse_dir, host.wheels, phase, remaining)
    limit = remaining()
    command = install_worker_command(plan, wheelhouse, wheelhouse_dir, limit)
    code = session.exec(command, on_output=lines.feed, timeout=limit + 2 * KILL_AFTER_SECONDS)
    lines.flush()
    venv = phase_field(lines.seen, "worker-venv")
    if code == 124:
        raise BootstrapTimeout(f"installing the worker on {session.target} ran out of time")
    if code != 0 or not venv:
        raise BootstrapError(
            f"installing the worker on {session.target} failed (exit {code})", list(lines.tail)
        )
    return venv


def _start_worker(
    session: SshSession,
    plan: BootstrapPlan,
    wheelhouse: Wheelhouse,
    tunnel: ReverseTunnel,
    worker_venv: str,
    lines: Lines,
    timeout: float,
    remaining: Callable[[], float],
) -> RemoteWorker:
    """Run the script, which links the install and starts the worker; returns once it
    joined."""
    wheelhouse_dir = plan.wheelhouse_dir or default_wheelhouse_dir(plan.install_dir, wheelhouse.key)
    limit = remaining()
    command = install_command(
        plan,
        wheelhouse_dir,
        tunnel.remote_port,
        limit,
        wheelhouse.gpulayer_version or None,
        worker_venv=worker_venv,
    )
    code = session.exec(command, on_output=lines.feed, timeout=limit + 2 * KILL_AFTER_SECONDS)
    lines.flush()
    pid_text = phase_field(lines.seen, "worker-pid")
    pid_text = _started_pid(code, pid_text, session.target, timeout, lines)
    _prune_wheelhouses(session, wheelhouse_dir, lambda text: lines.emit(f"{PHASE_PREFIX} {text}"))
    return RemoteWorker(
        session,
        tunnel,
        pid=int(pid_text),
        install_dir=plan.install_dir,
        worker_id=phase_field(lines.seen, "worker-id"),
        wheelhouse_dir=wheelhouse_dir,
    )


def _started_pid(
    code: int, pid_text: str | None, target: object, timeout: float, lines: Lines
) -> str:
    """The worker's pid the install script printed; BootstrapTimeout or BootstrapError when
    the script failed, ran out of time or printed none."""
    if code != 0 or pid_text is None or not pid_text.isdigit():
        if code == 124:
            raise BootstrapTimeout(f"bootstrap on {target} ran past {timeout:g}s", list(lines.tail))
        raise BootstrapError(f"bootstrap on {target} failed (exit {code})", list(lines.tail))
    return pid_text


def _upload_wheels(
    session: SshSession,
    wheelhouse: Wheelhouse,
    wheelhouse_dir: str,
    present: dict[str, tuple[int, str]],
    phase: Callable[[str], None],
    remaining: Callable[[], float],
) -> None:
    names = missing_wheels(wheelhouse, present)
    if not names:
        phase(f"wheelhouse: all {len(wheelhouse.files)} wheels already on the host")
        return
    size = sum(wheelhouse.file(n).size for n in names)
    phase(
        f"wheelhouse: uploading {len(names)} of {len(wheelhouse.files)} wheels ({size >> 20} MiB)"
    )
    moves = []
    parts = []
    suffix = secrets.token_hex(4)
    try:
        for name in names:
            remaining()
            # A partial upload never carries a final name, so a job that reads the wheelhouse
            # at the same time sees a whole wheel or none.
            part = posixpath.join(wheelhouse_dir, f".{name}.part-{suffix}")
            parts.append(part)
            session.put(wheelhouse.path / name, part, mode=0o644)
            final = posixpath.join(wheelhouse_dir, name)
            moves.append(f"mv -f {shlex.quote(part)} {shlex.quote(final)}")
        result = session.run(" && ".join(moves), timeout=remaining())
    except BaseException:
        with contextlib.suppress(Exception):
            session.run(["rm", "-f", "--", *parts], timeout=30)
        raise
    if result.exit_code != 0:
        raise BootstrapError(
            f"cannot place the wheels in {wheelhouse_dir}",
            (result.stdout + result.stderr).splitlines(),
        )


def _prune_wheelhouses(
    session: SshSession, wheelhouse_dir: str, phase: Callable[[str], None]
) -> None:
    """Each gpulayer version leaves a wheelhouse on the host; only the newest few stay."""
    from gpulayer.ssh.errors import SshError

    command = prune_wheelhouses_command(wheelhouse_dir)
    if command is None:
        return
    try:
        session.run(command, timeout=60)
    except SshError as exc:  # an old wheelhouse left over is no reason to fail the job
        phase(f"could not prune old wheelhouses: {exc}")


def _upload_files(session: SshSession, plan: BootstrapPlan, remaining: Callable[[], float]) -> None:
    from gpulayer.cloud.images import bootstrap_script

    remaining()
    session.put(bootstrap_script(), posixpath.join(plan.install_dir, SCRIPT_NAME), mode=0o700)
    with tempfile.TemporaryDirectory(prefix="gpulayer-token-") as scratch:
        local = Path(scratch) / TOKEN_NAME
        local.touch(mode=0o600)
        local.write_text(plan.worker_token)
        session.put(local, posixpath.join(plan.install_dir, TOKEN_NAME), mode=0o600)


def _undo(session: SshSession, install_dir: str, lines: Lines) -> None:
    """Best effort after a failure: end whatever started, remove the install dir."""
    from gpulayer.ssh.errors import SshError

    if not session.connected:
        lines.emit(f"{PHASE_PREFIX} lost the host; cannot clean up {install_dir}")
        return
    for command in (stop_command(install_dir, 2), remove_command(install_dir)):
        try:
            code, output = run_collect(session, command, 30 + STOP_GRACE_SECONDS)
        except SshError as exc:
            lines.emit(f"{PHASE_PREFIX} cleanup failed: {exc}")
            return
        if code != 0:
            lines.emit(f"{PHASE_PREFIX} cleanup step failed (exit {code}): {' | '.join(output)}")
