"""What a bootstrap is asked to do, checked before any host is touched. Pure.

The install dir is the one place on the host a job may write and later remove, so only a
dedicated directory is accepted: absolute, normalized, two or more levels deep, not a system
directory and not a home directory.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field

from gpulayer.cloud.bootstrap.errors import BootstrapPlanError
from gpulayer.errors import UsageError

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
    instance_request_id: str | None = None
    """The launch request of the instance; the worker registers with it."""
    node_address: str | None = None
    """Where the other nodes of a gang reach this one (the worker's ``--address``); None: the
    worker finds its own."""
    hand_off: bool = False
    """A launcher of the machine's own starts the worker (a Slurm allocation's step, see
    :func:`gpulayer.cloud.bootstrap.commands.launcher_loop`); False: the bootstrap starts it."""
    tunnel_address: str | None = None
    """With ``hand_off``: the launcher runs on other machines that share the install dir (a
    Slurm cluster's compute nodes, the bootstrap on its login node), and the worker reaches
    the control plane's tunnel at this address of the SSH host, where it listens. None: the
    worker runs on the SSH host and reaches the tunnel on its loopback."""
    worker_root: str | None = None
    """Where the host keeps the worker's installs, one per version, shared by its jobs; None:
    ``<install_dir>/../worker``."""


_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,252}$")
"""A host name or IPv4 address, as it goes into the worker's server URL."""


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
    from gpulayer.protocol.deadman import DeadmanAction

    check_install_dir(plan.install_dir)
    if plan.wheelhouse_dir is not None:
        check_install_dir(plan.wheelhouse_dir, field_name="wheelhouse_dir")
    if plan.worker_root is not None:
        check_install_dir(plan.worker_root, field_name="worker_root")
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
    if plan.tunnel_address is not None and not plan.hand_off:
        raise BootstrapPlanError("tunnel_address: only with hand_off (a launcher elsewhere)")
    if plan.tunnel_address is not None and not _HOST.match(plan.tunnel_address):
        raise BootstrapPlanError(f"tunnel_address: {plan.tunnel_address!r} is not a host")
    for name in ("provider", "region", "zone", "node_address"):
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


def format_seconds(value: float) -> str:
    return repr(float(value)) if value != int(value) else str(int(value))


def worker_args(plan: BootstrapPlan, remote_port: int) -> list[str]:
    """The arguments of ``gpulayer worker start`` on the host (no token: that goes by file)."""
    args = [
        "--server",
        f"http://{plan.tunnel_address or '127.0.0.1'}:{remote_port}",
        "--name",
        plan.worker_name,
        "--kind",
        plan.kind,
        "--work-dir",
        f"{plan.install_dir}/jobs",
        "--setup-cache",
        default_setup_cache_dir(plan.install_dir),
        "--heartbeat-seconds",
        format_seconds(plan.heartbeat_seconds),
        "--deadman-seconds",
        format_seconds(plan.deadman_seconds),
        "--deadman-action",
        plan.deadman_action,
        "--currency",
        plan.currency,
    ]
    for flag, value in (
        ("--provider", plan.provider),
        ("--region", plan.region),
        ("--zone", plan.zone),
        ("--instance-request-id", plan.instance_request_id),
        ("--address", plan.node_address),
    ):
        if value is not None:
            args += [flag, value]
    if plan.hourly_price is not None:
        args += ["--hourly-price", format_seconds(plan.hourly_price)]
    for key, value in sorted(plan.labels.items()):
        args += ["--label", f"{key}={value}"]
    return args


def default_setup_cache_dir(install_dir: str) -> str:
    """Beside the per-job install dirs: a later job on the host reuses the environments."""
    return posixpath.join(posixpath.dirname(install_dir), "setup-envs")


def default_wheelhouse_dir(install_dir: str, key: str) -> str:
    """Beside the per-job install dirs, shared by the jobs of one host."""
    return posixpath.join(posixpath.dirname(install_dir), "wheelhouse", key)
