"""Real OpenSSH sshd hosts for tests, each standing in for a machine gpulayer logs into.

Three flavours behind one interface (:class:`SshdLab` makes :class:`SshdHost` objects):

* ``rootfs`` (root, the default there): a machine of its own. A bridge on a private /24 and, per
  host, a network namespace joined to it by a veth pair, with its own address; inside it, its own
  mount, PID and UTS namespaces over a minimal Debian root filesystem (``tests/support/rootfs``,
  an overlay per host): none of the controller's paths, packages or Python, its own ``python3``.
* ``netns`` (root, asked for by name): the same network, but over the controller's filesystem,
  for registered workers that run this very interpreter.
* ``loopback`` (no root, or no namespaces): sshd on 127.0.0.x and a free port.

Every process a host starts (sshd, its sessions, ``host.run`` commands) carries the marker
variable ``GPULAYER_TEST_SSHD=<run>:<host>`` in its environment, so teardown finds them all
even after they leave the process tree. Names of bridges, veths and namespaces embed the run
id; a run records its owner process under ``state_root()``, and :func:`cleanup_stale` removes
whatever belongs to runs whose owner is gone (a crashed or killed earlier run).

Only addresses of the namespaces made here and loopback addresses are ever targets.

Use from a conftest::

    from tests.support.sshd_hosts import ssh_host, ssh_hosts, sshd_lab  # noqa: F401
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import ipaddress
import logging
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath, PurePosixPath
from typing import Literal

import pytest

from gpulayer.ssh.target import SshTarget
from tests.support import rootfs

log = logging.getLogger(__name__)

Mode = Literal["rootfs", "netns", "loopback"]

SSHD = "/usr/sbin/sshd"
MARKER = "GPULAYER_TEST_SSHD"
MODE_ENV = "GPULAYER_TEST_SSHD_MODE"
PREFIX = "gls"  # gpulayer sshd: every bridge, veth and namespace name starts with it
_SUBNET_SECOND_OCTET = 231  # 10.231.<n>.0/24; rarely used by real networks
# How long a host may take to boot and its sshd to answer: seconds where the machine is idle,
# and more than 10 were seen once on a 2-core machine busy with the suite's journeys.
_READY_SECONDS = 30.0
_BANNER_SECONDS = 5.0
# Where a rootfs host's sshd keeps its config, keys and pid: on the host's own disk, so that no
# path of the controller has to exist there.
HOST_SSHD_DIR = PurePosixPath("/etc/ssh/gpulayer-test")
HOST_KEY_NAME = "ssh_host_ed25519_key"
_KILL_SECONDS = 5.0


class SshdHostError(RuntimeError):
    """A test host could not be created, started or removed."""


# -- small process and command tools ------------------------------------------------------------


def _run(args: Sequence[str], *, check: bool = True, timeout: float = 30) -> str:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise SshdHostError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid``: with the pid it names a process even across pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(pid: int, start_time: str) -> bool:
    return _start_time(pid) == start_time


def _our_pids(marker: str, *, run_wide: bool, config_path: str) -> list[int]:
    """Processes of a host (or of a whole run, ``run_wide``): those whose environment carries
    the marker, sshd processes started with our config, and every descendant of either.

    sshd rewrites its process title over its environment, so sshd processes are found by the
    config path that stays in the title, and their per-connection children by descent."""
    needle = f"{MARKER}={marker}".encode()
    parent_of: dict[int, int] = {}
    roots: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state == "Z":
            continue  # already dead, only waiting for its parent to reap it
        parent_of[pid] = int(ppid)
        marked = any(
            item.startswith(needle) if run_wide else item == needle for item in environ.split(b"\0")
        )
        if marked or config_path.encode() in cmdline:
            roots.add(pid)
    children: dict[int, list[int]] = {}
    for pid, parent in parent_of.items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    found.discard(os.getpid())
    return sorted(found)


def _kill_until_gone(find: Callable[[], list[int]], what: str) -> None:
    deadline = time.monotonic() + _KILL_SECONDS
    while True:
        pids = find()
        if not pids:
            return
        if time.monotonic() > deadline:
            raise SshdHostError(f"processes of {what} survive SIGKILL: {pids}")
        # Freeze first, then look again: a parent killed before its fresh child is seen would
        # orphan that child out of the tree we find processes by.
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
        for pid in sorted(set(pids) | set(find())):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


def _first_child(pid: int) -> int | None:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def _runs_host_python(pid: int | None) -> bool:
    """Whether ``pid`` has exec'd the host's python (a rootfs host's PID 1, after chroot)."""
    if pid is None:
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return argv[0] == b"/usr/bin/python3"


def _keygen(path: Path, comment: str) -> str:
    path.unlink(missing_ok=True)
    path.with_name(path.name + ".pub").unlink(missing_ok=True)
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    return path.with_name(path.name + ".pub").read_text().strip()


def _write_file(path: Path, data: bytes, *, append: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not append and (path.is_symlink() or (path.exists() and not path.is_file())):
        path.unlink()  # an overlay's whiteout of a file removed earlier, say
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC), 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _banner(address: str, port: int, timeout: float) -> str | None:
    """None once sshd answers with its banner; else what happened instead, and at which step."""
    try:
        sock = socket.create_connection((address, port), timeout=timeout)
    except OSError as exc:
        return f"connect: {type(exc).__name__}: {exc}"
    with sock:
        try:
            sock.settimeout(timeout)
            first = sock.recv(64)
        except OSError as exc:
            return f"banner: {type(exc).__name__}: {exc}"
    return None if first.startswith(b"SSH-") else f"answered {first[:20]!r}"


# -- runs: ownership and stale cleanup ------------------------------------------------------------


def state_root() -> Path:
    if os.geteuid() == 0:
        return Path("/run/gpulayer-test-sshd")
    return Path(f"/tmp/gpulayer-test-sshd-{os.getuid()}")


@contextlib.contextmanager
def _state_lock() -> Iterator[None]:
    root = state_root()
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _run_is_live(run_id: str) -> bool:
    try:
        pid, start = (state_root() / run_id / "owner").read_text().split()
    except (OSError, ValueError):
        return False
    return _alive(int(pid), start)


def _names_with_prefix() -> tuple[list[str], list[str]]:
    """Our namespaces and our links (bridges, outer and not yet moved inner veths, probes)."""
    if not shutil.which("ip"):
        return [], []
    namespaces = [
        words[0]
        for words in map(str.split, _run(["ip", "netns", "list"], check=False).splitlines())
        if words and words[0].startswith(PREFIX + "n")
    ]
    links = []
    for line in _run(["ip", "-o", "link", "show"], check=False).splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if name.startswith((PREFIX + "b", PREFIX + "v", PREFIX + "p")):
                links.append(name)
    return namespaces, links


def _run_of(name: str) -> str:
    # Every name is PREFIX + one kind letter + the 6-hex run id (+ more for hosts).
    return name[len(PREFIX) + 1 : len(PREFIX) + 7]


def cleanup_stale() -> list[str]:
    """Remove namespaces, links, processes and state of runs whose owner is gone.

    Returns what was removed. Runs of living processes (a parallel test run) are left alone."""
    removed: list[str] = []
    with _state_lock():
        root = state_root()
        runs = {p.name for p in root.iterdir() if p.is_dir()}
        namespaces, links = _names_with_prefix()
        runs |= {_run_of(n) for n in namespaces + links}
        for run_id in sorted(runs):
            if _run_is_live(run_id):
                continue
            _kill_until_gone(functools.partial(_run_pids, run_id), f"stale run {run_id}")
            for ns in namespaces:
                if _run_of(ns) == run_id:
                    _kill_until_gone(functools.partial(_netns_pids, ns), ns)
                    _run(["ip", "netns", "del", ns], check=False)
                    removed.append(ns)
            # Veths first: deleting the bridge does not delete the veths attached to it.
            for link in sorted(links, key=lambda n: n.startswith(PREFIX + "b")):
                if _run_of(link) == run_id:
                    _run(["ip", "link", "del", link], check=False)
                    removed.append(link)
            shutil.rmtree(root / run_id, ignore_errors=True)
            removed.append(f"state {run_id}")
        _release_netns_mount()
    return removed


def _run_pids(run_id: str) -> list[int]:
    return _our_pids(f"{run_id}:", run_wide=True, config_path=f"{state_root() / run_id}/")


def _netns_pids(ns: str) -> list[int]:
    out = _run(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in out.split() if p.isdigit()]


def _release_netns_mount() -> None:
    # `ip netns add` turns /run/netns into a mount point; once no namespace is left, undo it.
    # A namespace added meanwhile by someone else keeps it busy and the umount simply fails.
    netns_dir = Path("/run/netns")
    if os.geteuid() != 0 or not netns_dir.is_dir() or any(netns_dir.iterdir()):
        return
    # A bind mount of a directory onto itself fools os.path.ismount; ask the mount table.
    for _ in range(3):
        if not _is_mount_point(netns_dir):
            return
        try:
            _run(["umount", str(netns_dir)])
        except SshdHostError:
            return


def _is_mount_point(path: Path) -> bool:
    try:
        table = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return False
    return any(line.split()[4] == str(path) for line in table.splitlines() if line.strip())


def netns_usable() -> bool:
    """Whether network namespaces can be made here (root, iproute2, unshare), whatever mode
    the lab's hosts take by default."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"):
        return False
    probe = f"{PREFIX}p{secrets.token_hex(3)}"
    try:
        _run(["ip", "link", "add", probe, "type", "bridge"])
    except SshdHostError:
        return False
    _run(["ip", "link", "del", probe], check=False)
    return True


def choose_mode() -> Mode:
    wanted = os.environ.get(MODE_ENV, "").strip()
    if wanted == "loopback":
        return "loopback"
    if wanted in ("netns", "rootfs"):
        if not netns_usable():
            raise SshdHostError(f"{MODE_ENV}={wanted} but network namespaces are not usable here")
        return "rootfs" if wanted == "rootfs" else "netns"
    if wanted:
        raise SshdHostError(f"{MODE_ENV} must be 'rootfs', 'netns' or 'loopback', got {wanted!r}")
    # As root, a test host is a machine of its own; loopback hosts only where that cannot be.
    return "rootfs" if netns_usable() else "loopback"


# -- hosts ---------------------------------------------------------------------------------------


@dataclass(eq=False)
class SshdHost:
    """One sshd host. ``address``/``port``/``user``/``client_key`` are what a client needs;
    ``host_key`` is its public host key (``ssh-ed25519 AAAA...``) for pinning tests."""

    lab: SshdLab
    index: int
    name: str
    address: str
    port: int
    user: str
    workdir: Path
    client_key: Path = field(init=False)
    client_public_key: str = field(init=False)
    host_key: str = field(init=False)
    extra_config: list[str] = field(default_factory=list, init=False, repr=False)
    # Folders of this machine a rootfs host mounts at boot, as a cluster's nodes mount a
    # shared filesystem: (this machine's path, the path on the host).
    shares: list[tuple[Path, PurePosixPath]] = field(default_factory=list, init=False)
    host_key_names: list[str] = field(default_factory=list, init=False, repr=False)
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _init: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _timer: threading.Timer | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.client_key = self.workdir / "client_key"
        self.client_public_key = _keygen(self.client_key, f"client@{self.name}")
        self.host_key = _keygen(self.host_key_path, f"root@{self.name}")
        self.host_key_names.append(HOST_KEY_NAME)
        self.set_authorized_keys(self.client_public_key + "\n")
        self.config_path.write_text(self._config())

    # files: this machine's copies (keys made here, the config as configured) and the host's

    @property
    def host_key_path(self) -> Path:
        """This machine's copy of the host key; sshd reads the one under :attr:`sshd_dir`."""
        return self.workdir / HOST_KEY_NAME

    @property
    def sshd_dir(self) -> PurePosixPath:
        """Where the host's sshd finds its config, host keys, authorized keys and pid file, as
        the host sees it. A rootfs host has them on its own disk; the others share this
        machine's files."""
        if self.lab.mode == "rootfs":
            return HOST_SSHD_DIR
        return PurePosixPath(self.workdir)

    @property
    def authorized_keys(self) -> PurePosixPath:
        """The path of the host's authorized_keys file, on the host."""
        return self.sshd_dir / "authorized_keys"

    @property
    def config_path(self) -> Path:
        """This machine's record of the sshd config. Hosts that share this machine's files run
        sshd on it (in the run's state directory: the path in sshd's title names the run)."""
        return self.lab.run_dir / f"host-{self.index}.sshd_config"

    @property
    def sshd_config(self) -> PurePosixPath:
        """The config sshd is started with, as the host sees it."""
        if self.lab.mode == "rootfs":
            return HOST_SSHD_DIR / "sshd_config"
        return PurePosixPath(self.config_path)

    @property
    def log_path(self) -> Path:
        return self.workdir / "sshd.log"

    @property
    def fs_dir(self) -> Path:
        """A rootfs host's own disk: the upper layer of its overlay (kept across restarts)."""
        return self.lab.base_dir / f"host{self.index}-fs"

    def init_pid(self) -> int:
        """The pid (as this machine sees it) of a rootfs host's PID 1, booting the host first."""
        if self._init is None or self._init.poll() is not None:
            self._boot()
        assert self._init is not None
        pid = _first_child(self._init.pid)
        if pid is None:
            raise SshdHostError(f"{self.name} has no PID 1: {self._boot_log()}")
        return pid

    def _boot(self) -> None:
        booted = self.workdir / ".booted"
        booted.unlink(missing_ok=True)
        with (self.workdir / "boot.log").open("ab") as logfile:
            self._init = subprocess.Popen(
                self.lab.boot_argv(self),
                stdin=subprocess.DEVNULL,
                stdout=logfile,
                stderr=subprocess.STDOUT,
                env=self._env(),
                start_new_session=True,
            )
        deadline = time.monotonic() + _READY_SECONDS
        # PID 1 is ready once it runs the host's own python: until then it is the setup shell
        # (or chroot) with this machine's root, and a process entering it would see our disk.
        while not (booted.exists() and _runs_host_python(_first_child(self._init.pid))):
            if self._init.poll() is not None:
                raise SshdHostError(f"{self.name} did not boot: {self._boot_log()}")
            if time.monotonic() > deadline:
                raise SshdHostError(f"{self.name} not booted after {_READY_SECONDS}s")
            time.sleep(0.02)

    def _boot_log(self) -> str:
        try:
            return (self.workdir / "boot.log").read_text(errors="replace").strip()[-400:]
        except OSError:
            return "(no boot log)"

    @property
    def marker(self) -> str:
        return f"{self.lab.run_id}:{self.index}"

    def configure(self, *lines: str) -> None:
        """Add sshd_config lines, effective at the next (re)start. They go before the defaults,
        because sshd keeps the first value it reads for most keywords."""
        self.extra_config.extend(lines)
        self.config_path.write_text(self._config())

    def _config(self) -> str:
        listen = (
            f"[{self.address}]:{self.port}"
            if ":" in self.address
            else f"{self.address}:{self.port}"
        )
        return "\n".join(
            [
                *self.extra_config,
                f"ListenAddress {listen}",
                *(f"HostKey {self.sshd_dir / name}" for name in self.host_key_names),
                f"PidFile {self.sshd_dir / 'sshd.pid'}",
                f"AuthorizedKeysFile {self.authorized_keys}",
                "StrictModes no",
                "UsePAM no",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password",
                "AllowTcpForwarding yes",
                "Subsystem sftp internal-sftp",
                "UseDNS no",
                "PrintMotd no",
                "MaxStartups 100:30:200",
                "MaxSessions 64",
                "LogLevel VERBOSE",
                # Sessions carry the marker so teardown finds them wherever they wander.
                f"SetEnv {MARKER}={self.marker}",
                "",
            ]
        )

    def authorize(self, public_key: str) -> None:
        """Accept another client key, as cloud-init does with the key a launch request names."""
        self._write_on_host(self.authorized_keys, public_key.strip().encode() + b"\n", append=True)

    def set_authorized_keys(self, text: str) -> None:
        """Make ``text`` the host's whole authorized_keys file (a launch's only key)."""
        self._write_on_host(self.authorized_keys, text.encode())

    def add_host_key(self, private_key: Path) -> None:
        """Offer the key pair at ``private_key`` (made on this machine) as another host key,
        from the next (re)start."""
        name = private_key.name
        if private_key.parent != self.workdir:
            shutil.copy2(private_key, self.workdir / name)
            shutil.copy2(private_key.with_name(name + ".pub"), self.workdir / f"{name}.pub")
        if name not in self.host_key_names:
            self.host_key_names.append(name)
        self.config_path.write_text(self._config())

    def _write_on_host(self, path: PurePosixPath, data: bytes, *, append: bool = False) -> None:
        """Write (or append to) the file at ``path`` as the host sees it, mode 0600. A rootfs
        host that is up gets it through its own root; one that is down on its disk, the upper
        layer of its overlay (which nothing has mounted then)."""
        if self.lab.mode != "rootfs":
            _write_file(Path(path), data, append=append)
            return
        if self._init is None or self._init.poll() is not None:
            _write_file(self.fs_dir / "upper" / path.relative_to("/"), data, append=append)
            return
        script = (
            'umask 077 && mkdir -p "$(dirname "$1")" && '
            'if [ "$2" = a ]; then cat >> "$1"; else cat > "$1.new" && mv "$1.new" "$1"; fi'
        )
        done = subprocess.run(
            self.lab.wrap(self, ["sh", "-c", script, "sh", str(path), "a" if append else "w"]),
            input=data,
            capture_output=True,
            timeout=60,
            env=self._env(),
            check=False,
        )
        if done.returncode != 0:
            raise SshdHostError(f"writing {path} on {self.name}: {done.stderr.decode().strip()}")

    def _install_sshd_files(self) -> None:
        """Put the config and host keys, as configured here, where the host's sshd reads them."""
        if self.lab.mode == "loopback" or self.lab.mode == "netns":
            return  # sshd reads this machine's own copies
        self._write_on_host(self.sshd_config, self._config().encode())
        for name in self.host_key_names:
            self._write_on_host(self.sshd_dir / name, (self.workdir / name).read_bytes())

    def target(self, *, pin: bool = False, key_path: Path | None = None) -> SshTarget:
        """How gpulayer reaches this host; ``pin`` passes the real host key as the provider would."""
        return SshTarget(
            self.address,
            self.port,
            self.user,
            key_path=key_path or self.client_key,
            host_key=self.host_key if pin else None,
        )

    # the host's own files, as the host sees them

    def exists(self, path: str | PurePath) -> bool:
        return self.run(["test", "-e", str(path)]).returncode == 0

    def read_text(self, path: str | PurePath) -> str:
        done = self.run(["cat", str(path)])
        if done.returncode != 0:
            raise FileNotFoundError(f"{path} on {self.name}: {done.stderr.strip()}")
        return done.stdout

    def read_bytes(self, path: str | PurePath) -> bytes:
        """The file's raw bytes (``/proc/PID/environ`` and the like hold NULs)."""
        done = subprocess.run(
            self.lab.wrap(self, ["cat", str(path)]),
            capture_output=True,
            timeout=60,
            env=self._env(),
            check=False,
        )
        if done.returncode != 0:
            raise FileNotFoundError(f"{path} on {self.name}: {done.stderr.decode().strip()}")
        return done.stdout

    def session_pids(self) -> list[int]:
        """The host's processes (as this machine sees them) other than its listening sshd and
        the boot processes of a rootfs host: what SSH sessions and their commands left."""
        own = set()
        if self._process is not None:
            own.add(self._process.pid)
        if self._init is not None:
            own.add(self._init.pid)
            child = _first_child(self._init.pid)
            if child is not None:
                own.add(child)
        return [pid for pid in self.lab.pids_of(self) if pid not in own]

    def listing(self, folder: str | Path) -> list[str] | None:
        """The names in ``folder`` on the host, sorted; None where it is no folder there."""
        done = self.run(["sh", "-c", 'test -d "$1" && ls -A "$1"', "sh", str(folder)])
        return sorted(done.stdout.split()) if done.returncode == 0 else None

    @contextlib.contextmanager
    def keeping(self, pattern: str, keep_as: str | PurePath) -> Iterator[None]:
        """While in the block, the first file matching the shell glob ``pattern`` to appear on
        the host gets a second name, ``keep_as`` (a hard link: same file system), so what is
        written to it is still there after a teardown removed the first name. The watch runs
        on the host itself and looks every 50 ms."""
        watch = (
            'while :; do for f in $1; do if [ -f "$f" ]; then ln "$f" "$2"; exit; fi; done; '
            "sleep 0.05; done"
        )
        argv = self.lab.wrap(self, ["sh", "-c", watch, "sh", pattern, str(keep_as)], fork=False)
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=self._env(),
        )
        try:
            yield
        finally:
            if process.poll() is None:
                process.kill()  # nothing appeared; ``keep_as`` stays absent
            _, err = process.communicate(timeout=_KILL_SECONDS)
            if process.returncode not in (0, -signal.SIGKILL):
                raise SshdHostError(f"keeping {pattern} on {self.name}: {err.decode().strip()}")

    def processes_mentioning(self, text: str) -> list[int]:
        """Live processes whose command line contains ``text``, by the pids this host gave them
        (a rootfs host has a process table of its own)."""
        listing = self.run(["ps", "-e", "-ww", "-o", "pid=,stat=,args="], check=True).stdout
        found = []
        for line in listing.splitlines():
            words = line.split(None, 2)
            if len(words) == 3 and text in words[2] and not words[1].startswith(("Z", "X")):
                found.append(int(words[0]))
        return found

    # lifecycle

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, delay: float = 0.0) -> None:
        """Start sshd and wait for its banner; with ``delay``, return at once and start it
        ``delay`` seconds later, as a booting machine refuses SSH for its first seconds."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if delay > 0:
                self._timer = threading.Timer(delay, self._delayed_start)
                self._timer.daemon = True
                self._timer.start()
                return
        self._spawn()
        self.wait_ready()

    def _delayed_start(self) -> None:
        # Spawned under the lock that stop() takes: a stop either cancels this or sees its sshd.
        with self._lock:
            if self._timer is not threading.current_thread():
                return  # stopped or restarted meanwhile
            self._timer = None
            try:
                self._spawn_locked()
            except OSError as exc:
                log.error("delayed start of %s failed: %s", self.name, exc)

    def _spawn(self) -> None:
        with self._lock:
            self._spawn_locked()

    def _spawn_locked(self) -> None:
        if self.running:
            return
        self.log_path.unlink(missing_ok=True)
        if os.geteuid() == 0:
            # sshd's privilege separation wants this directory and refuses to start without.
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        self._install_sshd_files()
        argv = self.lab.wrap(self, [SSHD, "-D", "-e", "-f", str(self.sshd_config)], fork=False)
        with self.log_path.open("ab") as logfile:
            self._process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=logfile,
                stderr=subprocess.STDOUT,
                env=self._env(),
                start_new_session=True,
            )

    def _env(self) -> dict[str, str]:
        return {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
            MARKER: self.marker,
        }

    def wait_ready(self, timeout: float = _READY_SECONDS) -> None:
        deadline = time.monotonic() + timeout
        last = "not started"
        while time.monotonic() < deadline:
            process = self._process
            if process is not None and process.poll() is not None:
                raise SshdHostError(f"sshd of {self.name} exited: {self.log_tail()}")
            if process is not None:
                # A try waits long enough for sshd to re-exec itself on a loaded machine: tries
                # given up early leave half-open sessions behind that only add to the load.
                left = deadline - time.monotonic()
                problem = _banner(self.address, self.port, max(0.5, min(_BANNER_SECONDS, left)))
                if problem is None:
                    return
                last = problem
            time.sleep(0.02)
        raise SshdHostError(
            f"sshd of {self.name} not ready after {timeout}s (last try: {last}; "
            f"{self._neighbour()}): {self.log_tail()}"
        )

    def _neighbour(self) -> str:
        """What this machine's ARP table says of the host's address, for a host not reached."""
        if not self.lab.namespaced:
            return "loopback"
        entry = _run(["ip", "neigh", "show", "to", self.address], check=False).strip()
        return f"neighbour: {entry or 'none'}"

    def stop(self) -> None:
        """Kill sshd and everything its sessions started; a pending delayed start is cancelled."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            process, self._process = self._process, None
        # sshd itself is killed with the rest, never first: its connections would be orphaned
        # out of the process tree that finds them.
        _kill_until_gone(lambda: self.lab.pids_of(self), self.name)
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        if process is not None:
            process.wait(timeout=_KILL_SECONDS)
        init, self._init = self._init, None
        if init is not None:
            with contextlib.suppress(ProcessLookupError):
                init.kill()
            init.wait(timeout=_KILL_SECONDS)

    def stop_listening(self) -> None:
        """Kill only the listening sshd: sessions already open (and what they run) go on, new
        connections are refused until :meth:`start`."""
        with self._lock:
            process, self._process = self._process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait(timeout=_KILL_SECONDS)

    def restart(self, *, new_host_key: bool = False) -> None:
        """Stop and start again; ``new_host_key`` first replaces the host key, as a machine
        reinstalled behind the same address (or an impostor) would present."""
        self.stop()
        if new_host_key:
            self.host_key = _keygen(self.host_key_path, f"root@{self.name}")
        self.start()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def run(
        self, command: str | Sequence[str], *, timeout: float = 60, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """Run a command on the host without SSH: in its namespace, hostname and hosts file."""
        shell = ["sh", "-c", command] if isinstance(command, str) else list(command)
        done = subprocess.run(
            self.lab.wrap(self, shell),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self._env(),
            check=False,
        )
        if check and done.returncode != 0:
            raise SshdHostError(f"{command!r} on {self.name} failed: {done.stderr.strip()}")
        return done


class LastLook:
    """What some folders held on each host just before the host was removed: a terminated
    instance's disk is gone with it, so a cloud emulator looks at it one last time."""

    def __init__(self) -> None:
        self._folders: list[str] = []
        self._seen: dict[str, dict[str, list[str] | None]] = {}
        self._lock = threading.Lock()

    def watch(self, *folders: str | Path) -> None:
        with self._lock:
            self._folders += [str(f) for f in folders]

    def take(self, host: SshdHost) -> None:
        with self._lock:
            folders = list(self._folders)
        seen = {folder: host.listing(folder) for folder in folders}
        with self._lock:
            self._seen[host.name] = seen

    def of(self, host_name: str) -> dict[str, list[str] | None]:
        """Folder -> its names (None: no such folder) on ``host_name`` when it was removed."""
        with self._lock:
            return dict(self._seen[host_name])


# -- labs: a set of hosts on one network ----------------------------------------------------------


class SshdLab:
    """Hosts of one test run. Create with :meth:`create`; :meth:`close` removes everything."""

    def __init__(self, base_dir: Path, mode: Mode, run_id: str) -> None:
        self.base_dir = base_dir
        self.mode: Mode = mode
        self.run_id = run_id
        self.hosts: list[SshdHost] = []
        self._counter = 0
        self._next_address = 0
        self._lock = threading.Lock()
        self._closed = False
        self.subnet: ipaddress.IPv4Network | None = None
        self.bridge = f"{PREFIX}b{run_id}"
        self.hosts_file = self.run_dir / "hosts"
        self.rootfs: Path | None = None  # the read-only lower layer of every host's own root

    @property
    def namespaced(self) -> bool:
        """Whether hosts have addresses of their own on the lab's bridge."""
        return self.mode != "loopback"

    @property
    def run_dir(self) -> Path:
        return state_root() / self.run_id

    @property
    def gateway(self) -> str:
        """The controller side's address as the hosts see it."""
        if self.subnet is None:
            return "127.0.0.1"
        return str(self.subnet.network_address + 1)

    @classmethod
    def create(cls, base_dir: Path, mode: Mode | None = None) -> SshdLab:
        if not Path(SSHD).exists() or not shutil.which("ssh-keygen"):
            raise SshdHostError(
                "OpenSSH is missing: apt-get install -y openssh-server (tests need real sshd)"
            )
        cleanup_stale()
        mode = mode or choose_mode()
        lab = cls(Path(base_dir), mode, secrets.token_hex(3))
        if mode == "rootfs":
            try:
                lab.rootfs = rootfs.ensure()
            except rootfs.RootfsError as exc:
                raise SshdHostError(f"no root filesystem for test hosts: {exc}") from exc
        atexit.register(lab.close)
        with _state_lock():
            lab.run_dir.mkdir(mode=0o700)
            pid = os.getpid()
            (lab.run_dir / "owner").write_text(f"{pid} {_start_time(pid)}\n")
            if lab.namespaced:
                try:
                    lab._make_bridge()
                except BaseException:
                    lab._remove_bridge()
                    raise
        lab._write_hosts_file()
        return lab

    def __repr__(self) -> str:
        return f"<SshdLab {self.run_id} {self.mode} hosts={len(self.hosts)}>"

    # network

    def _make_bridge(self) -> None:
        # Every IPv4 network named by an address or a route here is off limits.
        words = _run(["ip", "-o", "-4", "addr", "show"]).split()
        words += _run(["ip", "-4", "route", "show", "table", "all"], check=False).split()
        taken = []
        for word in words:
            with contextlib.suppress(ValueError):
                taken.append(ipaddress.IPv4Network(word, strict=False))
        candidates = list(range(256))
        random.shuffle(candidates)
        for third in candidates:
            net = ipaddress.IPv4Network(f"10.{_SUBNET_SECOND_OCTET}.{third}.0/24")
            if any(net.overlaps(t) for t in taken if t.prefixlen > 0):
                continue
            self.subnet = net
            break
        else:
            raise SshdHostError(f"no free 10.{_SUBNET_SECOND_OCTET}.x.0/24 subnet left")
        (self.run_dir / "subnet").write_text(str(self.subnet))
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])

    def _remove_bridge(self) -> None:
        _run(["ip", "link", "del", self.bridge], check=False)

    def _write_hosts_file(self) -> None:
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        if self.namespaced:
            lines.append(f"{self.gateway}\tcontroller")
            lines += [f"{h.address}\t{h.name}" for h in self.hosts]
        text = "\n".join(lines) + "\n"
        # Rewritten in place: hosts see it through a bind mount, which pins the inode.
        with open(self.hosts_file, "a+") as handle:
            handle.seek(0)
            handle.truncate()
            handle.write(text)

    def _netns(self, host: SshdHost) -> str:
        return f"{PREFIX}n{self.run_id}-{host.index}"

    def _veth(self, host: SshdHost) -> tuple[str, str]:
        suffix = f"{host.index:03x}"
        return f"{PREFIX}v{self.run_id}{suffix}", f"{PREFIX}p{self.run_id}{suffix}"

    def _plumb(self, host: SshdHost) -> None:
        ns = self._netns(host)
        outer, inner = self._veth(host)
        _run(["ip", "netns", "add", ns])
        _run(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner])
        _run(["ip", "link", "set", outer, "master", self.bridge, "up"])
        _run(["ip", "link", "set", inner, "netns", ns])
        _run(["ip", "-n", ns, "link", "set", inner, "name", "eth0"])
        _run(["ip", "-n", ns, "addr", "add", f"{host.address}/24", "dev", "eth0"])
        _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])

    def unplug(self, host: SshdHost) -> None:
        """Pull the host's cable: nothing reaches it and it reaches nothing, while everything
        on it runs on (a machine that lost power or its switch port, as others see it)."""
        self._cable(host, "down")

    def plug(self, host: SshdHost) -> None:
        self._cable(host, "up")

    def _cable(self, host: SshdHost, state: str) -> None:
        if not self.namespaced:
            raise SshdHostError(f"a {self.mode} lab's hosts have no cable to pull")
        outer, _ = self._veth(host)
        _run(["ip", "link", "set", outer, state])

    def _unplumb(self, host: SshdHost) -> None:
        ns = self._netns(host)
        outer, _ = self._veth(host)
        # The veth must go explicitly: it can outlive its namespace while a process holds it.
        _run(["ip", "link", "del", outer], check=False)
        _run(["ip", "netns", "del", ns], check=False)

    def wrap(self, host: SshdHost, argv: list[str], *, fork: bool = True) -> list[str]:
        """``argv`` as it must be run to execute "on" ``host``. On a rootfs host it enters the
        host's namespaces and root; ``fork=False`` keeps the process itself outside the host's
        PID namespace (its children are inside), so killing it kills that very process."""
        if self.mode == "loopback":
            return argv
        if self.mode == "rootfs":
            init = host.init_pid()
            return [
                "nsenter", f"--target={init}", "--mount", "--uts", "--net", "--pid",
                "--root", "--wd", *([] if fork else ["--no-fork"]), "--", *argv,
            ]  # fmt: skip
        setup = 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"'
        return [
            "ip", "netns", "exec", self._netns(host),
            "unshare", "--uts", "--mount", "--propagation", "private",
            "sh", "-c", setup, "sh", str(self.hosts_file), host.name, *argv,
        ]  # fmt: skip

    def boot_argv(self, host: SshdHost) -> list[str]:
        """The host's first process: in the host's network namespace, new mount, PID and UTS
        namespaces over an overlay of the root filesystem, then PID 1 that only reaps. Of this
        machine's files only the lab's hosts file is bound in, at /etc/hosts, and the folders
        given in :attr:`SshdHost.shares`: no other path of the controller exists on the host
        (sshd's files are written onto the host's own disk)."""
        assert self.rootfs is not None
        fs = host.fs_dir
        for part in ("upper", "work", "root"):
            (fs / part).mkdir(parents=True, exist_ok=True)
        setup = r"""
set -eu
R=$1/root
mount -t overlay overlay -o "lowerdir=$2,upperdir=$1/upper,workdir=$1/work" "$R"
mount -t proc proc "$R/proc"
mount -t sysfs sysfs "$R/sys"
mount -t tmpfs -o mode=1777 tmpfs "$R/tmp"
mount -t tmpfs -o mode=755 tmpfs "$R/run"
mkdir -p "$R/run/sshd" "$R/run/lock"
mount -t tmpfs -o mode=755 tmpfs "$R/dev"
for node in null:1:3 zero:1:5 full:1:7 random:1:8 urandom:1:9 tty:5:0; do
    name=${node%%:*}; rest=${node#*:}
    mknod -m 666 "$R/dev/$name" c "${rest%%:*}" "${rest#*:}"
done
mkdir -p "$R/dev/pts" "$R/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$R/dev/pts"
ln -s pts/ptmx "$R/dev/ptmx"
mount -t tmpfs -o mode=1777 tmpfs "$R/dev/shm"
ln -s /proc/self/fd "$R/dev/fd"
touch "$R/etc/hosts"
mount --bind "$3" "$R/etc/hosts"
hostname "$5"
BOOTED=$4 REAPER=$6
shift 6
while [ $# -gt 1 ]; do
    mkdir -p "$R$2"
    mount --bind "$1" "$R$2"
    shift 2
done
touch "$BOOTED"
exec chroot "$R" /usr/bin/python3 -c "$REAPER"
"""
        reaper = (
            "import os, signal\n"
            "signal.signal(signal.SIGCHLD, lambda *_: None)\n"
            "while True:\n"
            "    try:\n"
            "        while os.waitpid(-1, os.WNOHANG)[0]:\n"
            "            pass\n"
            "    except ChildProcessError:\n"
            "        pass\n"
            "    signal.pause()\n"
        )
        return [
            "ip", "netns", "exec", self._netns(host),
            "unshare", "--mount", "--uts", "--pid", "--fork", "--propagation", "private",
            "sh", "-c", setup, "sh", str(fs), str(self.rootfs), str(self.hosts_file),
            str(host.workdir / ".booted"), host.name, reaper,
            *(str(p) for share in host.shares for p in share),
        ]  # fmt: skip

    def pids_of(self, host: SshdHost) -> list[int]:
        pids = set(_our_pids(host.marker, run_wide=False, config_path=str(host.config_path)))
        if self.namespaced:
            pids.update(_netns_pids(self._netns(host)))
        return sorted(pids)

    # hosts

    def _free_address(self) -> tuple[str, int]:
        used = {h.address for h in self.hosts}
        if self.namespaced:
            assert self.subnet is not None
            # Handed out in turn, as DHCP does, not lowest first: an address comes back only
            # after the rest, long after anything here (ARP, a connection) last knew it.
            candidates = list(self.subnet.hosts())[1:]
            for step in range(len(candidates)):
                candidate = str(candidates[(self._next_address + step) % len(candidates)])
                if candidate not in used:
                    self._next_address = (self._next_address + step + 1) % len(candidates)
                    return candidate, 22
            raise SshdHostError(f"subnet {self.subnet} is full")
        for last in range(2, 255):
            address = f"127.0.0.{last}"
            if address in used:
                continue
            with socket.socket() as probe:
                try:
                    probe.bind((address, 0))
                except OSError:
                    continue
                return address, probe.getsockname()[1]
        raise SshdHostError("no free loopback address")

    def _requested_address(self, address: str) -> tuple[str, int]:
        """``address`` when it is a free host address of this lab's own network."""
        if not self.namespaced or self.subnet is None:
            raise SshdHostError(f"a host at {address} needs a netns lab; this one is {self.mode}")
        try:
            wanted = ipaddress.IPv4Address(address)
        except ValueError:
            raise SshdHostError(f"{address!r} is not an IPv4 address") from None
        if wanted not in self.subnet or str(wanted) == self.gateway:
            raise SshdHostError(f"{address} is not a host address of the lab's {self.subnet}")
        if wanted in (self.subnet.network_address, self.subnet.broadcast_address):
            raise SshdHostError(f"{address} is not a host address of the lab's {self.subnet}")
        if any(h.address == str(wanted) for h in self.hosts):
            raise SshdHostError(f"{address} is taken by another host of the lab")
        return str(wanted), 22

    def add_host(
        self, name: str | None = None, *, start: bool = True, address: str | None = None
    ) -> SshdHost:
        """A new host; ``address`` puts it at that free address of the lab's network (netns
        labs only), as a cloud hands an instance the address it picked, instead of the next
        free one."""
        if self._closed:
            raise SshdHostError("lab is closed")
        with self._lock:
            index = self._counter
            self._counter += 1
            address, port = (
                self._free_address() if address is None else self._requested_address(address)
            )
            user = "root" if os.geteuid() == 0 else _user_name()
            host = SshdHost(
                lab=self,
                index=index,
                name=name or f"node{index}",
                address=address,
                port=port,
                user=user,
                workdir=self.base_dir / f"host{index}",
            )
            self.hosts.append(host)
        try:
            if self.namespaced:
                self._plumb(host)
            self._write_hosts_file()
            if start:
                host.start()
        except BaseException:
            self.remove_host(host)
            raise
        return host

    def add_hosts(
        self, count: int, *, names: Sequence[str] | None = None, start: bool = True
    ) -> list[SshdHost]:
        if names is not None and len(names) != count:
            raise ValueError(f"{count} hosts but {len(names)} names")
        hosts: list[SshdHost] = []
        try:
            for i in range(count):
                hosts.append(self.add_host(names[i] if names else None, start=False))
            if start:
                # Spawned together, then awaited together: startups overlap.
                for host in hosts:
                    host._spawn()
                for host in hosts:
                    host.wait_ready()
        except BaseException:
            for host in hosts:
                self.remove_host(host)
            raise
        return hosts

    def addresses_taken(self) -> set[str]:
        """The addresses the lab's hosts hold now, those of hosts still leaving included."""
        with self._lock:
            return {h.address for h in self.hosts}

    def remove_host(self, host: SshdHost) -> None:
        try:
            host.stop()
        finally:
            if self.namespaced:
                self._unplumb(host)
            with self._lock:
                if host in self.hosts:
                    self.hosts.remove(host)
            shutil.rmtree(host.fs_dir, ignore_errors=True)
            if self.hosts_file.exists():
                self._write_hosts_file()

    def close(self) -> None:
        """Remove every host, the bridge and the run's state. Idempotent; never raises half-way:
        each step is tried and the first failure reported at the end."""
        if self._closed:
            return
        self._closed = True
        errors: list[BaseException] = []
        for host in list(self.hosts):
            try:
                self.remove_host(host)
            except Exception as exc:
                errors.append(exc)
        try:
            _kill_until_gone(lambda: _run_pids(self.run_id), f"run {self.run_id}")
        except Exception as exc:
            errors.append(exc)
        if self.namespaced:
            self._remove_bridge()
        with _state_lock():
            shutil.rmtree(self.run_dir, ignore_errors=True)
            _release_netns_mount()
        atexit.unregister(self.close)
        if errors:
            raise SshdHostError(f"teardown of {self} incomplete: {errors[0]}") from errors[0]

    def host_leftovers(self, host: SshdHost) -> list[str]:
        """Anything of a removed ``host`` still present."""
        namespaces, links = _names_with_prefix()
        found = [n for n in namespaces if n == self._netns(host)]
        found += [n for n in links if n in self._veth(host)]
        found += [f"pid {p}" for p in self.pids_of(host)]
        return found

    def leftovers(self) -> list[str]:
        """Anything of this run still present; empty after a clean :meth:`close`."""
        found: list[str] = []
        namespaces, links = _names_with_prefix()
        found += [n for n in namespaces + links if _run_of(n) == self.run_id]
        found += [f"pid {p}" for p in _run_pids(self.run_id)]
        if self.run_dir.exists():
            found.append(str(self.run_dir))
        return found


def _user_name() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


# -- pytest fixtures -------------------------------------------------------------------------------

HostFactory = Callable[..., list[SshdHost]]


@pytest.fixture(scope="session")
def sshd_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdLab]:
    """One lab (bridge and subnet, or loopback) for the whole test session."""
    lab = SshdLab.create(tmp_path_factory.mktemp("sshd-lab"))
    try:
        yield lab
    finally:
        lab.close()
    left = lab.leftovers()
    if left:
        raise SshdHostError(f"test hosts left behind: {left}")


@pytest.fixture
def ssh_hosts(sshd_lab: SshdLab) -> Iterator[HostFactory]:
    """``ssh_hosts(n, names=None, start=True) -> list[SshdHost]``; all removed after the test."""
    made: list[SshdHost] = []

    def make(
        count: int = 1, *, names: Sequence[str] | None = None, start: bool = True
    ) -> list[SshdHost]:
        hosts = sshd_lab.add_hosts(count, names=names, start=start)
        made.extend(hosts)
        return hosts

    yield make
    errors: list[Exception] = []
    for host in reversed(made):
        try:
            sshd_lab.remove_host(host)
        except Exception as exc:
            errors.append(exc)
        left = sshd_lab.host_leftovers(host)
        if left:
            errors.append(SshdHostError(f"{host.name} left behind: {left}"))
    if errors:
        raise errors[0]


@pytest.fixture
def ssh_host(ssh_hosts: HostFactory) -> SshdHost:
    """One started host."""
    return ssh_hosts(1)[0]
