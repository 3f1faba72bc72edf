"""The commands a bootstrap runs on the host, and reading their answers. Pure.

Every command is one POSIX sh line; paths and arguments are quoted, and the join token is
never part of one.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpulayer.cloud.bootstrap.errors import BootstrapPlanError, HostIncompatible
from gpulayer.cloud.bootstrap.plan import (
    BootstrapPlan,
    check_install_dir,
    format_seconds,
    worker_args,
)
from gpulayer.cloud.bootstrap.worker_install import WorkerInstall, read_worker_state

if TYPE_CHECKING:
    from gpulayer.cloud.wheelhouse import Wheelhouse

MIN_PYTHON = (3, 10)
PHASE_PREFIX = "gpulayer-bootstrap:"
SCRIPT_NAME = "bootstrap.sh"
TOKEN_NAME = "worker.token"
PID_NAME = "worker.pid"
LOG_NAME = "worker.log"
STOP_GRACE_SECONDS = 10.0
KILL_AFTER_SECONDS = 5


@dataclass(frozen=True)
class HostPython:
    """What the host's python said about itself."""

    version: str
    implementation: str
    platform: str
    glibc: str | None
    has_venv: bool
    executable: str
    wheels: dict[str, tuple[int, str]]
    """Wheel file name -> (size, sha256) already in the host's wheelhouse dir (empty when
    the worker's install is there and sound: no wheel is needed)."""
    worker: WorkerInstall | None = None
    """The worker's install the probe was asked about, as found."""


def install_command(
    plan: BootstrapPlan,
    wheelhouse_dir: str,
    remote_port: int,
    time_limit: float,
    gpulayer_version: str | None = None,
    worker_venv: str | None = None,
) -> str:
    """The host command that runs the script, bounded by ``timeout`` where the host has it.
    ``gpulayer_version`` pins what the script installs should it fall back to an index;
    ``worker_venv``, the worker's verified install, is linked rather than installed."""
    script = posixpath.join(plan.install_dir, SCRIPT_NAME)
    join_timeout = max(5, int(time_limit) - KILL_AFTER_SECONDS)
    argv = [
        "sh",
        script,
        "install",
        "--install-dir",
        plan.install_dir,
        "--wheelhouse",
        wheelhouse_dir,
        "--python",
        plan.python,
        "--token-file",
        posixpath.join(plan.install_dir, TOKEN_NAME),
        "--join-timeout",
        str(join_timeout),
    ]
    if plan.system_site_packages:
        argv.append("--system-site-packages")
    if plan.hand_off:
        argv.append("--hand-off")
        if plan.tunnel_address:
            argv.append("--launched-elsewhere")
    if gpulayer_version:
        argv += ["--index-version", gpulayer_version]
    if worker_venv:
        argv += ["--worker-venv", worker_venv]
    argv += ["--", *worker_args(plan, remote_port)]
    bounded = ["timeout", "-k", str(KILL_AFTER_SECONDS), str(max(1, int(time_limit))), *argv]
    return (
        f"if command -v timeout >/dev/null 2>&1; then exec {shlex.join(bounded)}; "
        f"else exec {shlex.join(argv)}; fi"
    )


LAUNCH_DIR_VARIABLE = "GPULAYER_LAUNCH_DIR"


def launcher_loop() -> str:
    """Shell code for a launcher of the machine's own (a Slurm step on each node): it starts
    the worker each bootstrap with ``hand_off`` hands to the install dir named by
    ``$GPULAYER_LAUNCH_DIR``, and waits for the next once that worker ends (a controller
    that restarts bootstraps again). The install dir is read from the environment, never
    written into the launcher's own arguments: a stop ends whatever names the install dir,
    and the launcher outlives its workers."""
    d = f'"${LAUNCH_DIR_VARIABLE}"'
    return (
        f"while :; do if mv {d}/launch {d}/launch.run 2>/dev/null; "
        f"then sh {d}/launch.run; fi; sleep 1; done"
    )


def stop_command(install_dir: str, grace_seconds: float = STOP_GRACE_SECONDS) -> str:
    """Host command: end the worker of ``install_dir`` (TERM to its group, KILL after the
    grace) and every process that names a path in the install dir or works in it (pip, jobs).
    Succeeds when nothing runs there."""
    check_install_dir(install_dir)
    script = posixpath.join(install_dir, SCRIPT_NAME)
    argv = [
        "sh",
        script,
        "stop",
        "--install-dir",
        install_dir,
        "--grace",
        format_seconds(grace_seconds),
    ]
    # Without the script (it never arrived) no worker was started, but a timed-out step may
    # still run: the sweep below is the script's own, inline.
    sweep = (
        f"D={shlex.quote(install_dir + '/')}; export D; "
        'pids=$( { ps -e -o pid= -o args= 2>/dev/null | awk \'index($0, ENVIRON["D"]) '
        "{ print $1 }'; "
        f"find /proc/[0-9]*/cwd -maxdepth 0 \\( -lname {shlex.quote(install_dir)} -o -lname "
        f"{shlex.quote(install_dir + '/*')} \\) 2>/dev/null | "
        "sed 's,^/proc/\\([0-9]*\\)/cwd$,\\1,'; } | sort -u | "
        'grep -v -x -e "$$" -e "$PPID"); '
        '[ -z "$pids" ] || kill -KILL $pids 2>/dev/null; true'
    )
    return f"if [ -f {shlex.quote(script)} ]; then {shlex.join(argv)}; else {sweep}; fi"


def remove_command(install_dir: str) -> str:
    """Host command: delete ``install_dir``, refusing when it holds the login's home."""
    check_install_dir(install_dir)
    quoted = shlex.quote(install_dir)
    return (
        f'case "${{HOME:-/nonexistent}}/" in {quoted}/*) '
        f"echo '{PHASE_PREFIX} error: refusing to remove {install_dir}: it holds the home "
        "directory' >&2; exit 1;; esac; "
        # A process that was just killed may still be writing; a second pass takes the rest.
        f"rm -rf -- {quoted} 2>/dev/null || {{ sleep 1; rm -rf -- {quoted}; }}"
    )


HOST_WHEELHOUSES_KEPT = 2


def prune_wheelhouses_command(wheelhouse_dir: str, keep: int = HOST_WHEELHOUSES_KEPT) -> str | None:
    """Host command: keep the ``keep`` newest wheelhouses beside ``wheelhouse_dir`` (which
    counts as the newest), removing older ones; None where the dir is not in the default
    ``.../wheelhouse/gpulayer-*`` layout, which is the only one gpulayer owns."""
    parent, name = posixpath.split(wheelhouse_dir.rstrip("/"))
    if posixpath.basename(parent) != "wheelhouse" or not name.startswith("gpulayer-"):
        return None
    check_install_dir(parent)
    quoted = shlex.quote(parent)
    return (
        f"cd {quoted} && touch -c -- {shlex.quote(name)} && "
        f"ls -1dt gpulayer-*/ 2>/dev/null | tail -n +{int(keep) + 1} | "
        'while IFS= read -r old; do rm -rf -- "${old%/}"; done; true'
    )


def probe_command(
    python: str, install_dir: str, wheelhouse_dir: str, worker: list[str] | None = None
) -> str:
    """Host command: the host's python describes itself (and, given ``worker``, the
    :func:`~gpulayer.cloud.bootstrap.worker_install.worker_probe_args`, whether the worker's
    install is there and sound; the wheels it holds only when it is not)."""
    from gpulayer.cloud.bootstrap.worker_install import host_source

    minimum = ".".join(map(str, MIN_PYTHON))
    argv = [python, "-c", host_source(), "probe", install_dir, wheelhouse_dir, minimum]
    run = shlex.join([*argv, *(worker or [])])
    missing = json.dumps({"missing": python})
    return (
        f"if ! command -v {shlex.quote(python)} >/dev/null 2>&1; then "
        f"echo {shlex.quote(missing)}; exit 0; fi; {run}"
    )


def parse_probe(text: str, python: str) -> HostPython:
    """Read the probe's JSON line; raise HostIncompatible for a host that cannot run the
    worker."""
    line = next((ln for ln in reversed(text.splitlines()) if ln.startswith("{")), "")
    try:
        data: dict[str, Any] = json.loads(line)
    except ValueError:
        raise HostIncompatible(
            f"python {python!r} on the host does not run", text.splitlines()
        ) from None
    if "missing" in data:
        raise HostIncompatible(
            f"python {python!r} not found on the host; install python3 (>= 3.10) "
            "or set the host's python"
        )
    if data.get("refused"):
        raise BootstrapPlanError(f"install_dir: {data['refused']}")
    version = str(data.get("version", "0.0.0"))
    numbers = tuple(int(p) for p in version.split(".")[:2])
    if numbers < MIN_PYTHON:
        raise HostIncompatible(
            f"python {version} at {data.get('executable')} is too old; the worker needs "
            f"python >= {'.'.join(map(str, MIN_PYTHON))}"
        )
    if not data.get("venv"):
        raise HostIncompatible(
            f"python {version} at {data.get('executable')} has no venv module "
            "(Debian/Ubuntu: apt-get install python3-venv)"
        )
    wheels = {str(k): (int(v[0]), str(v[1])) for k, v in dict(data.get("wheels", {})).items()}
    return HostPython(
        version=version,
        implementation=str(data.get("implementation", "cpython")),
        platform=str(data.get("platform", "")),
        glibc=data.get("glibc") or None,
        has_venv=True,
        executable=str(data.get("executable", python)),
        wheels=wheels,
        worker=read_worker_state(data.get("worker")),
    )


def missing_wheels(wheelhouse: Wheelhouse, present: dict[str, tuple[int, str]]) -> list[str]:
    """Wheels the host lacks or holds with another size or digest."""
    return [w.name for w in wheelhouse.files if present.get(w.name) != (w.size, w.sha256)]


def phase_field(lines: list[str], name: str) -> str | None:
    marker = f"{PHASE_PREFIX} {name}="
    for line in reversed(lines):
        if line.startswith(marker):
            return line[len(marker) :].strip()
    return None
