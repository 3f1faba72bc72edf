"""Turn a machine reachable over SSH into a worker of this control plane.

Steps, all within one time budget: ask the host's python for its version and platform (and
refuse a host the wheelhouse does not fit before anything is installed), upload the wheels the
host does not already have (same name, size and SHA-256: a second job on the host sends none),
the bootstrap script and the join token, open a reverse tunnel from the host's loopback to
the control plane, and run the script, which installs into a venv under the install dir and
starts the worker detached. The call returns once the worker has joined.

The join token travels only as a file (0600, in a 0700 directory) that the script reads into
the worker's environment and then deletes: it never appears in a command line, in output or
in an error. A failed bootstrap stops whatever it started on the host, removes the install
dir and closes the tunnel before raising.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import posixpath
import re
import secrets
import shlex
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpulayer.errors import GpulayerError, UsageError

if TYPE_CHECKING:
    from gpulayer.cloud.wheelhouse import Wheelhouse
    from gpulayer.ssh.session import SshSession, Stream
    from gpulayer.ssh.tunnel import ReverseTunnel

log = logging.getLogger("gpulayer.bootstrap")

MIN_PYTHON = (3, 10)
PHASE_PREFIX = "gpulayer-bootstrap:"
SCRIPT_NAME = "bootstrap.sh"
TOKEN_NAME = "worker.token"
PID_NAME = "worker.pid"
LOG_NAME = "worker.log"
STOP_GRACE_SECONDS = 10.0
_TAIL_LINES = 40
_KILL_AFTER_SECONDS = 5
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9_.@+/-]+$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@:-]{0,127}$")
_LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./:-]{0,127}$")

# Directories that are never an install dir, nor may an install dir lie directly in a home.
_SYSTEM_ROOTS = frozenset(
    {"bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "sys"}
    | {"usr", "run", "snap"}
)
_SYSTEM_DIRS = frozenset(
    {
        "/var/lib",
        "/var/log",
        "/var/tmp",
        "/var/cache",
        "/var/spool",
        "/var/mail",
        "/var/run",
        "/var/opt",
        "/var/backups",
        "/home",
        "/root",
        "/tmp",
        "/opt",
        "/srv",
        "/mnt",
        "/media",
        "/Users",
    }
)


class BootstrapError(GpulayerError):
    """The worker could not be set up on the host. ``output_tail`` holds the last lines the
    host printed; nothing the bootstrap started is left running there."""

    def __init__(self, message: str, output_tail: Iterable[str] = ()) -> None:
        self.reason = message
        self.output_tail = tuple(output_tail)
        shown = [line for line in self.output_tail if line.strip()][-8:]
        super().__init__(f"{message}; last output: {' | '.join(shown)}" if shown else message)


class BootstrapTimeout(BootstrapError):
    """The bootstrap did not finish within its time budget."""


class HostIncompatible(BootstrapError):
    """The host's python cannot run the worker: missing, too old, without venv, or not the
    python version and platform the wheelhouse was built for."""


class BootstrapPlanError(UsageError):
    """A bootstrap plan field that cannot be used; the message names the field."""


class RemoteWorkerError(GpulayerError):
    """Stopping or removing a bootstrapped worker failed (the host may be gone)."""


@dataclass
class BootstrapPlan:
    install_dir: str
    """On the host, per host and per job, e.g. /var/tmp/gpulayer/<job_id>."""
    control_plane_port: int
    """The control plane's port on this side's loopback (127.0.0.1)."""
    worker_token: str = field(repr=False)
    """Never written to logs, to the argv of a long-lived process, or into an error."""
    worker_name: str
    labels: dict[str, str]
    provider: str | None = None
    region: str | None = None
    zone: str | None = None
    hourly_price: float | None = None
    currency: str = "USD"
    deadman_seconds: float = 600
    deadman_action: str = "poweroff"
    """poweroff (a rented instance), stop (a host we do not own), record:PATH (tests)."""
    python: str = "python3"
    heartbeat_seconds: float = 5.0
    kind: str = "cloud"
    """The worker kind it registers as: cloud, or remote for a host that joins a pool."""
    wheelhouse_dir: str | None = None
    """Where the host keeps wheels between jobs; None: ``<install_dir>/../wheelhouse/<key>``."""
    system_site_packages: bool = False
    """Let jobs see packages the image installed system-wide (e.g. a preinstalled torch)."""


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
    """Wheel file name -> (size, sha256) already in the host's wheelhouse dir."""


# --- pure parts ----------------------------------------------------------------------------------


def install_dir_problem(path: str) -> str | None:
    """Why ``path`` cannot be an install dir, or None. Only a dedicated directory can: absolute,
    normalized, two or more levels deep, not a system directory, not a home directory."""
    if not isinstance(path, str) or not path.startswith("/"):
        return "must be an absolute path such as /var/tmp/gpulayer/<job>"
    if not _SAFE_PATH.match(path):
        return "may hold only letters, digits and _ . @ + - /"
    if posixpath.normpath(path) != path or path.endswith("/"):
        return "must be a normalized path (no '..', '.', '//' or trailing '/')"
    parts = path.strip("/").split("/")
    if len(parts) < 2:
        return "must be at least two levels deep, e.g. /var/tmp/gpulayer/<job>"
    if parts[0] in _SYSTEM_ROOTS or path in _SYSTEM_DIRS:
        return "is a system directory"
    if any(path.startswith(d + "/") for d in ("/var/lib", "/var/log", "/var/run")):
        return "lies in a system directory"
    if parts[0] in ("home", "Users") and len(parts) == 2:
        return "is a home directory"
    return None


def check_install_dir(path: str, *, field_name: str = "install_dir") -> str:
    """``path`` when :func:`install_dir_problem` finds none, else BootstrapPlanError."""
    problem = install_dir_problem(path)
    if problem is not None:
        raise BootstrapPlanError(f"{field_name}: {path!r} {problem}")
    return path


def validate_plan(plan: BootstrapPlan) -> None:
    """Raise BootstrapPlanError naming the first field that cannot be used."""
    from gpulayer.worker.deadman import DeadmanAction

    check_install_dir(plan.install_dir)
    if plan.wheelhouse_dir is not None:
        check_install_dir(plan.wheelhouse_dir, field_name="wheelhouse_dir")
    port = plan.control_plane_port
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise BootstrapPlanError(f"control_plane_port: must be 1-65535, got {port!r}")
    token = plan.worker_token
    if not isinstance(token, str) or not token or any(c.isspace() for c in token):
        raise BootstrapPlanError("worker_token: must be a non-empty token without whitespace")
    if not isinstance(plan.worker_name, str) or not _NAME.match(plan.worker_name):
        raise BootstrapPlanError(
            f"worker_name: {plan.worker_name!r} must be 1-128 letters, digits, _ . @ : -"
        )
    for key, value in plan.labels.items():
        if not _LABEL_KEY.match(key):
            raise BootstrapPlanError(f"labels: key {key!r} must be letters, digits, _ . / : -")
        if not isinstance(value, str) or any(c in value for c in "\n\r\0"):
            raise BootstrapPlanError(f"labels.{key}: must be a one-line string")
    for name in ("provider", "region", "zone"):
        value = getattr(plan, name)
        if value is not None and (not value or any(c.isspace() for c in value)):
            raise BootstrapPlanError(f"{name}: must be a non-empty word, got {value!r}")
    from gpulayer.spec.currency import ISO_4217_CODES

    if plan.currency not in ISO_4217_CODES:
        raise BootstrapPlanError(f"currency: {plan.currency!r} is not an ISO 4217 code such as USD")
    if plan.hourly_price is not None and not plan.hourly_price >= 0:
        raise BootstrapPlanError(f"hourly_price: must be >= 0, got {plan.hourly_price!r}")
    for name in ("deadman_seconds", "heartbeat_seconds"):
        if not getattr(plan, name) > 0:
            raise BootstrapPlanError(f"{name}: must be > 0, got {getattr(plan, name)!r}")
    try:
        DeadmanAction.parse(plan.deadman_action)
    except UsageError:
        raise BootstrapPlanError(
            f"deadman_action: expected poweroff, stop or record:PATH, not {plan.deadman_action!r}"
        ) from None
    if not plan.python or any(c.isspace() or c in "\0'\"" for c in plan.python):
        raise BootstrapPlanError(f"python: {plan.python!r} must be a command or path")
    if plan.kind not in ("cloud", "remote"):
        raise BootstrapPlanError(f"kind: cloud or remote, not {plan.kind!r}")


def _number(value: float) -> str:
    return repr(float(value)) if value != int(value) else str(int(value))


def worker_args(plan: BootstrapPlan, remote_port: int) -> list[str]:
    """The arguments of ``gpulayer worker start`` on the host (no token: that goes by file)."""
    args = [
        "--server",
        f"http://127.0.0.1:{remote_port}",
        "--name",
        plan.worker_name,
        "--kind",
        plan.kind,
        "--work-dir",
        f"{plan.install_dir}/jobs",
        "--heartbeat-seconds",
        _number(plan.heartbeat_seconds),
        "--deadman-seconds",
        _number(plan.deadman_seconds),
        "--deadman-action",
        plan.deadman_action,
        "--currency",
        plan.currency,
    ]
    for flag, value in (
        ("--provider", plan.provider),
        ("--region", plan.region),
        ("--zone", plan.zone),
    ):
        if value is not None:
            args += [flag, value]
    if plan.hourly_price is not None:
        args += ["--hourly-price", _number(plan.hourly_price)]
    for key, value in sorted(plan.labels.items()):
        args += ["--label", f"{key}={value}"]
    return args


def default_wheelhouse_dir(install_dir: str, key: str) -> str:
    """Beside the per-job install dirs, shared by the jobs of one host."""
    return posixpath.join(posixpath.dirname(install_dir), "wheelhouse", key)


def install_command(
    plan: BootstrapPlan,
    wheelhouse_dir: str,
    remote_port: int,
    time_limit: float,
    gpulayer_version: str | None = None,
) -> str:
    """The host command that runs the script, bounded by ``timeout`` where the host has it.
    ``gpulayer_version`` pins what the script installs should it fall back to an index."""
    script = posixpath.join(plan.install_dir, SCRIPT_NAME)
    join_timeout = max(5, int(time_limit) - _KILL_AFTER_SECONDS)
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
    if gpulayer_version:
        argv += ["--index-version", gpulayer_version]
    argv += ["--", *worker_args(plan, remote_port)]
    bounded = ["timeout", "-k", str(_KILL_AFTER_SECONDS), str(max(1, int(time_limit))), *argv]
    return (
        f"if command -v timeout >/dev/null 2>&1; then exec {shlex.join(bounded)}; "
        f"else exec {shlex.join(argv)}; fi"
    )


def stop_command(install_dir: str, grace_seconds: float = STOP_GRACE_SECONDS) -> str:
    """Host command: end the worker of ``install_dir`` (TERM to its group, KILL after the
    grace) and every process that names a path in the install dir or works in it (pip, jobs).
    Succeeds when nothing runs there."""
    check_install_dir(install_dir)
    script = posixpath.join(install_dir, SCRIPT_NAME)
    argv = ["sh", script, "stop", "--install-dir", install_dir, "--grace", _number(grace_seconds)]
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


_PROBE = r"""
import hashlib, json, os, platform, sys, sysconfig
out = {"version": "%d.%d.%d" % tuple(sys.version_info[:3]), "executable": sys.executable}
impl = getattr(sys, "implementation", None)
out["implementation"] = impl.name if impl else platform.python_implementation().lower()
out["platform"] = sysconfig.get_platform().replace("-", "_").replace(".", "_")
libc = platform.libc_ver()
out["glibc"] = libc[1] if libc[0] == "glibc" else None
try:
    import venv
    out["venv"] = True
except ImportError:
    out["venv"] = False
install_dir, wheelhouse, want = sys.argv[1], sys.argv[2], tuple(map(int, sys.argv[3].split(".")))
home = os.path.realpath(os.path.expanduser("~"))
wheels = {}
if (home + "/").startswith(os.path.realpath(install_dir) + "/"):
    out["refused"] = "install_dir holds the home directory " + home
elif tuple(sys.version_info[:2]) >= want and out["venv"]:
    if not os.path.isdir(install_dir):
        os.makedirs(install_dir, 0o700)
    os.chmod(install_dir, 0o700)
    if not os.path.isdir(wheelhouse):
        os.makedirs(wheelhouse, 0o755)
    for name in sorted(os.listdir(wheelhouse)):
        path = os.path.join(wheelhouse, name)
        if name.endswith(".whl") and os.path.isfile(path):
            digest = hashlib.sha256()
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
            wheels[name] = [os.path.getsize(path), digest.hexdigest()]
out["wheels"] = wheels
sys.stdout.write(json.dumps(out) + "\n")
"""


def probe_command(python: str, install_dir: str, wheelhouse_dir: str) -> str:
    minimum = ".".join(map(str, MIN_PYTHON))
    run = shlex.join([python, "-c", _PROBE, install_dir, wheelhouse_dir, minimum])
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
    )


def missing_wheels(wheelhouse: Wheelhouse, present: dict[str, tuple[int, str]]) -> list[str]:
    """Wheels the host lacks or holds with another size or digest."""
    return [w.name for w in wheelhouse.files if present.get(w.name) != (w.size, w.sha256)]


def _field(lines: list[str], name: str) -> str | None:
    marker = f"{PHASE_PREFIX} {name}="
    for line in reversed(lines):
        if line.startswith(marker):
            return line[len(marker) :].strip()
    return None


# --- output --------------------------------------------------------------------------------------


class _Lines:
    """Turns output pieces into lines for ``on_output`` and keeps the last ones; the token is
    masked should any output ever carry it."""

    def __init__(self, on_output: Callable[[str], None], secret: str) -> None:
        self._on_output = on_output
        self._secret = secret
        self._partial: dict[str, str] = {"stdout": "", "stderr": ""}
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self.seen: list[str] = []

    def emit(self, line: str) -> None:
        line = line.replace(self._secret, "***") if self._secret else line
        self.tail.append(line)
        self.seen.append(line)
        try:
            self._on_output(line)
        except Exception:  # a failing observer must not fail the bootstrap
            log.exception("bootstrap output callback failed")

    def feed(self, stream: Stream, text: str) -> None:
        buffered = self._partial[stream] + text
        *complete, rest = buffered.split("\n")
        self._partial[stream] = rest
        for line in complete:
            self.emit(line.rstrip("\r"))

    def flush(self) -> None:
        for stream, rest in self._partial.items():
            if rest:
                self.emit(rest)
            self._partial[stream] = ""


# --- the remote worker ---------------------------------------------------------------------------


class RemoteWorker:
    """A worker started by :func:`bootstrap_worker`. Keep it (and its session) alive while the
    worker should reach the control plane: the tunnel is relayed by this process."""

    def __init__(
        self,
        session: SshSession,
        tunnel: ReverseTunnel,
        *,
        pid: int,
        install_dir: str,
        worker_id: str | None,
        wheelhouse_dir: str,
    ) -> None:
        self.session = session
        self.tunnel = tunnel
        self.remote_port = tunnel.remote_port
        self.pid = pid
        self.install_dir = install_dir
        self.worker_id = worker_id
        self.wheelhouse_dir = wheelhouse_dir

    def __repr__(self) -> str:
        return (
            f"<RemoteWorker pid={self.pid} id={self.worker_id} on {self.session.target} "
            f"in {self.install_dir}>"
        )

    def stop(self, grace_seconds: float = STOP_GRACE_SECONDS, timeout: float = 60.0) -> None:
        """End the worker's process group on the host (TERM, KILL after the grace) and close
        the tunnel. Idempotent."""
        from gpulayer.ssh.errors import SshError

        try:
            code, tail = _run(self.session, stop_command(self.install_dir, grace_seconds), timeout)
            if code != 0:
                raise RemoteWorkerError(
                    f"stopping the worker in {self.install_dir} on {self.session.target} "
                    f"failed (exit {code}): {' | '.join(tail[-5:])}"
                )
        except SshError as exc:
            raise RemoteWorkerError(
                f"cannot stop the worker on {self.session.target}: {exc}"
            ) from exc
        finally:
            self.tunnel.close()

    def cleanup(self, timeout: float = 60.0) -> None:
        """Remove the install dir (venv, jobs, logs); nothing else. Idempotent."""
        from gpulayer.ssh.errors import SshError

        try:
            code, tail = _run(self.session, remove_command(self.install_dir), timeout)
        except SshError as exc:
            raise RemoteWorkerError(
                f"cannot remove {self.install_dir} on {self.session.target}: {exc}"
            ) from exc
        if code != 0:
            raise RemoteWorkerError(
                f"removing {self.install_dir} on {self.session.target} failed (exit {code}): "
                f"{' | '.join(tail[-5:])}"
            )

    def close(self) -> None:
        """Close the tunnel and the SSH session (after :meth:`stop` and :meth:`cleanup`)."""
        self.tunnel.close()
        self.session.close()

    def log_tail(self, lines: int = 50, timeout: float = 30.0) -> str:
        """The end of the worker's own log on the host, for diagnosing a worker that left."""
        path = posixpath.join(self.install_dir, LOG_NAME)
        result = self.session.run(["tail", "-n", str(int(lines)), path], timeout=timeout)
        return result.stdout


def _run(session: SshSession, command: str, timeout: float) -> tuple[int, list[str]]:
    result = session.run(command, timeout=timeout)
    return result.exit_code, (result.stdout + result.stderr).splitlines()


# --- bootstrap ----------------------------------------------------------------------------------


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
    lines = _Lines(on_output, plan.worker_token)
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

    try:
        phase(f"probing python ({plan.python}) on {target}")
        # From here on the host may hold something of ours, even if this very call times out.
        touched = True
        probe = session.run(
            probe_command(plan.python, plan.install_dir, wheelhouse_dir), timeout=remaining()
        )
        host = parse_probe(probe.stdout + probe.stderr, plan.python)
        glibc = f", glibc {host.glibc}" if host.glibc else ""
        phase(f"host python {host.version} ({host.implementation}, {host.platform}{glibc})")
        why = wheelhouse.incompatibility(
            host.version, host.platform, glibc=host.glibc, implementation=host.implementation
        )
        if why is not None:
            raise HostIncompatible(why, lines.tail)
        _upload_wheels(session, wheelhouse, wheelhouse_dir, host.wheels, phase, remaining)
        _upload_files(session, plan, remaining)
        tunnel = open_reverse_tunnel(session, plan.control_plane_port)
        phase(f"tunnel: host 127.0.0.1:{tunnel.remote_port} -> control plane")
        limit = remaining()
        command = install_command(
            plan, wheelhouse_dir, tunnel.remote_port, limit, wheelhouse.gpulayer_version or None
        )
        code = session.exec(command, on_output=lines.feed, timeout=limit + 2 * _KILL_AFTER_SECONDS)
        lines.flush()
        pid_text = _field(lines.seen, "worker-pid")
        if code != 0 or pid_text is None or not pid_text.isdigit():
            if code == 124:
                raise BootstrapTimeout(
                    f"bootstrap on {target} ran past {timeout:g}s", list(lines.tail)
                )
            raise BootstrapError(f"bootstrap on {target} failed (exit {code})", list(lines.tail))
        worker = RemoteWorker(
            session,
            tunnel,
            pid=int(pid_text),
            install_dir=plan.install_dir,
            worker_id=_field(lines.seen, "worker-id"),
            wheelhouse_dir=wheelhouse_dir,
        )
        return worker
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


def _upload_files(session: SshSession, plan: BootstrapPlan, remaining: Callable[[], float]) -> None:
    from gpulayer.cloud.images import bootstrap_script

    remaining()
    session.put(bootstrap_script(), posixpath.join(plan.install_dir, SCRIPT_NAME), mode=0o700)
    with tempfile.TemporaryDirectory(prefix="gpulayer-token-") as scratch:
        local = Path(scratch) / TOKEN_NAME
        local.touch(mode=0o600)
        local.write_text(plan.worker_token)
        session.put(local, posixpath.join(plan.install_dir, TOKEN_NAME), mode=0o600)


def _undo(session: SshSession, install_dir: str, lines: _Lines) -> None:
    """Best effort after a failure: end whatever started, remove the install dir."""
    from gpulayer.ssh.errors import SshError

    if not session.connected:
        lines.emit(f"{PHASE_PREFIX} lost the host; cannot clean up {install_dir}")
        return
    for command in (stop_command(install_dir, 2), remove_command(install_dir)):
        try:
            code, output = _run(session, command, 30 + STOP_GRACE_SECONDS)
        except SshError as exc:
            lines.emit(f"{PHASE_PREFIX} cleanup failed: {exc}")
            return
        if code != 0:
            lines.emit(f"{PHASE_PREFIX} cleanup step failed (exit {code}): {' | '.join(output)}")
