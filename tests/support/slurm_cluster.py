"""A real Slurm cluster for tests: slurmctld here, compute and login nodes that are machines of
their own.

Debian's ``slurm-wlm`` (22.05) run with a private configuration, so nothing of the machine's
own /etc/slurm or /etc/munge is read or touched:

* slurmctld on this machine, on the lab bridge's address and a free port, with munged on a
  socket of its own (run as user ``munge``) and a key of its own;
* per compute node, a root-filesystem host of the lab (``tests/support/sshd_hosts``: its own
  network, mount and PID namespaces over a Debian root with Slurm's node packages, none of this
  machine's files or Python). On it run its own munged with the cluster's key and its own
  ``slurmd -N NODE`` reading the cluster's slurm.conf at /etc/slurm; its sshd reads the
  authorized_keys of the shared home and refuses logins from this machine, which reaches it
  through the login node;
* a login node: a host of the same kind with Slurm's commands, munged and /etc/slurm of its
  own, as users log into; its sshd reads the shared home's authorized_keys too;
* the cluster's shared filesystem: one folder of this machine mounted at ``/shared`` on every
  node (the users' home, a shared software area), as NFS is on a lab's cluster;
* accounting: slurmdbd over a MariaDB of the cluster's own (``tests/support/slurm_accounting``),
  so ``sacct`` (:meth:`SlurmCluster.ended_as`) tells how every allocation ended.

GPU nodes have no GPUs: their GRES names device files on the node (plain files), which 22.05's
gres/gpu plugin accepts; ``Count`` without ``File`` leaves a node ``inval``.

Every daemon here is a child of this process, ended by its pid at :meth:`SlurmCluster.close`;
the nodes' daemons and job steps live in the nodes' namespaces and end with them.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pytest

from tests.support import rootfs
from tests.support.slurm_accounting import SlurmAccounting, accounting_installed
from tests.support.sshd_hosts import MARKER, SshdHost, SshdLab, netns_usable

_READY_SECONDS = 30.0
_STOP_SECONDS = 10.0
SBIN = Path("/usr/sbin")
# Where every node mounts the cluster's shared filesystem, and where the nodes keep their own
# Slurm files (on their own disks).
SHARED_ON_NODES = PurePosixPath("/shared")
NODE_CONF = PurePosixPath("/etc/slurm/slurm.conf")
NODE_SPOOL = PurePosixPath("/var/spool/slurmd")
NODE_LOG = PurePosixPath("/var/log/slurm/slurmd.log")
NODE_GRES_DIR = PurePosixPath("/var/lib/gpulayer-test-gres")


class SlurmClusterError(RuntimeError):
    pass


def slurm_installed() -> bool:
    return all((SBIN / d).exists() for d in ("slurmctld", "slurmd", "munged")) and bool(
        shutil.which("sbatch")
    )


def usable() -> str | None:
    """Why no cluster can be started here, or None."""
    if not slurm_installed():
        return "slurm-wlm is not installed (apt-get install -y slurm-wlm)"
    if not accounting_installed():
        return "Slurm accounting is not installed (apt-get install -y slurmdbd mariadb-server)"
    if not netns_usable():
        return "network namespaces are not usable here (needs root and iproute2)"
    if not rootfs.available():
        return "no root filesystem for the nodes (needs root and mmdebstrap)"
    return None


@dataclass(frozen=True)
class NodeShape:
    """A compute node: ``gres`` like ``gpu:a100:2`` (or ``gpu:2``, untyped), None for none."""

    name: str
    cpus: int = 2
    memory_mb: int = 2000
    gres: str | None = None


@dataclass(frozen=True)
class PartitionShape:
    name: str
    nodes: tuple[str, ...]
    max_time: str = "UNLIMITED"
    default: bool = False


@dataclass
class _Daemon:
    what: str
    process: subprocess.Popen[bytes]
    log: Path


@dataclass(eq=False)
class SlurmCluster:
    lab: SshdLab
    base_dir: Path
    nodes: tuple[NodeShape, ...]
    partitions: tuple[PartitionShape, ...]
    name: str = "testlab"
    login: SshdHost | None = field(default=None, init=False)
    hosts: dict[str, SshdHost] = field(default_factory=dict, init=False)
    _daemons: list[_Daemon] = field(default_factory=list, init=False)
    _slurmd: dict[str, _Daemon] = field(default_factory=dict, init=False)
    _on_nodes: list[_Daemon] = field(default_factory=list, init=False)
    ctld_port: int = field(default=0, init=False)
    accounting: SlurmAccounting | None = field(default=None, init=False)
    # munged (not root) must reach its files: outside the private temp dirs of pytest.
    _munge_dir: Path = field(
        default_factory=lambda: Path(tempfile.mkdtemp(prefix="gpulayer-test-munge-", dir="/run")),
        init=False,
    )

    # paths

    @property
    def etc(self) -> Path:
        return self.base_dir / "etc"

    @property
    def conf_path(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def shared(self) -> Path:
        """This machine's side of the shared filesystem every node mounts at /shared."""
        return self.base_dir / "shared"

    def on_nodes(self, path: Path) -> PurePosixPath:
        """Where a path below :attr:`shared` is on the nodes."""
        return SHARED_ON_NODES / path.relative_to(self.shared)

    @property
    def shared_authorized_keys(self) -> Path:
        """The login user's authorized_keys as every node reads it (a cluster's shared home),
        this machine's side: :meth:`on_nodes` gives the path the provider writes to."""
        return self.shared / "home" / ".ssh" / "authorized_keys"

    @property
    def munge_socket(self) -> Path:
        return self._munge_dir / "munge.socket"

    def env(self) -> dict[str, str]:
        """Environment for Slurm's client commands on this machine."""
        return {**os.environ, "SLURM_CONF": str(self.conf_path)}

    # start and stop

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        self.shared_authorized_keys.parent.mkdir(parents=True, exist_ok=True)
        self.shared_authorized_keys.touch()
        for node in self.nodes:
            self.hosts[node.name] = self._add_node_host(node.name)
        self.ctld_port = _free_port(self.lab.gateway)
        accounting = SlurmAccounting(self.base_dir, self.lab.gateway)
        accounting.choose_ports()
        self.accounting = accounting
        self._write_config()
        spawn, wait = self._spawned, self._waited
        accounting.start_database(spawn, wait)
        self._start_munged()
        accounting.start_slurmdbd(
            spawn,
            wait,
            conf_dir=self.etc,
            controller_host=_controller_host(),
            munge_socket=self.munge_socket,
        )
        accounting.register(self.command, self.name, ["root", _login_user()])
        self._start_slurmctld()
        for node in self.nodes:
            host = self.hosts[node.name]
            self._install_slurm(host, node)
            self.start_slurmd(node.name)
        # Nodes answer SSH as a cluster's nodes do for a user's allocation, with the keys of
        # the shared home, and only from inside the cluster: a login from this machine's
        # address (the controller's) is refused, so the controller must go through the login
        # node.
        for node in self.nodes:
            host = self.hosts[node.name]
            host.configure(
                f"AuthorizedKeysFile {self.on_nodes(self.shared_authorized_keys)} "
                f"{host.authorized_keys}",
                f"DenyUsers *@{self.lab.gateway}",
            )
            host._spawn()
        for node in self.nodes:
            self.hosts[node.name].wait_ready()
        self.wait_nodes_idle([n.name for n in self.nodes])
        login = self._add_node_host("login")
        self._install_slurm(login, None)
        # The login node reads the shared home's keys as the nodes do (as on a cluster whose
        # home is NFS), besides its own.
        login.configure(
            f"AuthorizedKeysFile {self.on_nodes(self.shared_authorized_keys)} "
            f"{login.authorized_keys}",
            # A worker on a compute node reaches the control plane through a tunnel the
            # controller opens on the login node's address (shared_install_root).
            "GatewayPorts clientspecified",
        )
        login.start()
        self.login = login

    def _add_node_host(self, name: str) -> SshdHost:
        host = self.lab.add_host(name, start=False)
        host.shares.append((self.shared, SHARED_ON_NODES))
        host.init_pid()  # booted: files can be written onto its disk
        return host

    def _install_slurm(self, host: SshdHost, node: NodeShape | None) -> None:
        """The cluster's config and munge key onto ``host``'s own disk, its munged started;
        for a compute node (``node``) its GRES device files too."""
        host._write_on_host(NODE_CONF, self.conf_path.read_bytes())
        for name in ("gres.conf", "cgroup.conf"):
            host._write_on_host(NODE_CONF.with_name(name), (self.etc / name).read_bytes())
        key = PurePosixPath("/etc/munge/munge.key")
        host._write_on_host(key, (self._munge_dir / "munge.key").read_bytes())
        socket_dir = str(self.munge_socket.parent)
        setup = [
            f"chmod 644 {NODE_CONF.parent}/*.conf",
            f"mkdir -p {socket_dir} {NODE_SPOOL} {NODE_LOG.parent}",
            f"chown munge:munge {key} {socket_dir}",
            f"chmod 0400 {key}",
        ]
        if node is not None:
            # slurmd starts its cgroup plugin whatever the task and proctrack plugins are; an
            # empty cgroup v1 root is all it needs with those of this cluster (task/none,
            # proctrack/linuxproc, cgroup.conf naming v1), and gives the node no hold on this
            # machine's cgroups.
            setup.append("mount -t tmpfs -o mode=755 cgroup_root /sys/fs/cgroup")
        if node is not None and node.gres:
            count = int(node.gres.split(":")[-1])
            files = " ".join(f"{NODE_GRES_DIR}/nvidia{i}" for i in range(count))
            setup.append(f"mkdir -p {NODE_GRES_DIR} && touch {files}")
        host.run(" && ".join(setup), check=True)
        daemon = self._spawn_on(
            host,
            "munged",
            [
                "setpriv", "--reuid=munge", "--regid=munge", "--init-groups",
                str(SBIN / "munged"), "--foreground", f"--key-file={key}",
                f"--socket={self.munge_socket}", f"--pid-file={socket_dir}/munged.pid",
                f"--seed-file={socket_dir}/munged.seed", f"--log-file={socket_dir}/munged.log",
            ],
        )  # fmt: skip
        self._wait(lambda: host.exists(self.munge_socket), daemon, f"munged on {host.name}")

    def _write_config(self) -> None:
        self.etc.mkdir(parents=True, exist_ok=True)
        state = self.base_dir / "state"
        state.mkdir(exist_ok=True)
        logs = self.base_dir / "log"
        logs.mkdir(exist_ok=True)
        controller_host = _controller_host()
        assert self.accounting is not None
        lines = [
            f"ClusterName={self.name}",
            f"SlurmctldHost={controller_host}({self.lab.gateway})",
            f"SlurmctldPort={self.ctld_port}",
            "SlurmdPort=6818",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={state}",
            f"SlurmctldPidFile={self.base_dir / 'slurmctld.pid'}",
            f"SlurmctldLogFile={logs / 'slurmctld.log'}",
            # The nodes' own disks.
            f"SlurmdSpoolDir={NODE_SPOOL}",
            "SlurmdPidFile=/run/slurmd.pid",
            f"SlurmdLogFile={NODE_LOG}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            *self.accounting.slurm_conf_lines(self.munge_socket),
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            # The test machine has fewer cores than the nodes claim.
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "SchedulerParameters=sched_interval=2,bf_interval=2",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "KillWait=2",
            # How long an ended job stays in squeue --states=all (300 s by default): long enough
            # for the lifecycle to read how it ended (PREEMPTED) on its next check.
            "MinJobAge=60",
            "GresTypes=gpu",
            # A job of a partition with a higher PriorityTier (a test makes one) takes a lower
            # one's nodes by cancelling its jobs, which end PREEMPTED.
            "PreemptType=preempt/partition_prio",
            "PreemptMode=CANCEL",
        ]
        for node in self.nodes:
            host = self.hosts[node.name]
            gres = f" Gres={node.gres}" if node.gres else ""
            lines.append(
                f"NodeName={node.name} NodeAddr={host.address} CPUs={node.cpus} "
                f"RealMemory={node.memory_mb}{gres} State=UNKNOWN"
            )
        for part in self.partitions:
            default = "YES" if part.default else "NO"
            lines.append(
                f"PartitionName={part.name} Nodes={','.join(part.nodes)} Default={default} "
                f"MaxTime={part.max_time} State=UP"
            )
        self.conf_path.write_text("\n".join(lines) + "\n")
        self.etc.joinpath("gres.conf").write_text(self._gres_conf())
        self.etc.joinpath("cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")

    def _gres_conf(self) -> str:
        lines = ["AutoDetect=off"]
        for node in self.nodes:
            if not node.gres:
                continue
            parts = node.gres.split(":")
            count = int(parts[-1])
            gpu_type = parts[1] if len(parts) == 3 else None
            files = (
                f"{NODE_GRES_DIR}/nvidia[0-{count - 1}]"
                if count > 1
                else f"{NODE_GRES_DIR}/nvidia0"
            )
            typed = f" Type={gpu_type}" if gpu_type else ""
            lines.append(f"NodeName={node.name} Name=gpu{typed} File={files}")
        return "\n".join(lines) + "\n"

    def _spawn(
        self,
        what: str,
        argv: list[str],
        log: Path,
        env_extra: dict[str, str] | None = None,
        **kwargs: object,
    ) -> _Daemon:
        with log.open("ab") as out:
            process = subprocess.Popen(  # type: ignore[call-overload]
                argv,
                # The lab's marker: a crashed run's daemons are found and ended with its hosts.
                env={**os.environ, **(env_extra or {}), MARKER: f"{self.lab.run_id}:slurm"},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **kwargs,
            )
        daemon = _Daemon(what, process, log)
        self._daemons.append(daemon)
        return daemon

    def _spawned(self, what: str, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        # slurmdbd finds its slurmdbd.conf beside the slurm.conf SLURM_CONF names.
        return self._spawn(what, argv, log, env_extra={"SLURM_CONF": str(self.conf_path)}).process

    def _waited(self, ready: object, process: subprocess.Popen[bytes], what: str) -> None:
        daemon = next(d for d in self._daemons if d.process is process)
        self._wait(ready, daemon, what)

    def _spawn_on(self, host: SshdHost, what: str, argv: list[str]) -> _Daemon:
        """A daemon on a node, in its namespaces and root; it ends with the node."""
        log = self.base_dir / f"{what}-{host.name}.out"
        with log.open("ab") as out:
            process = subprocess.Popen(
                self.lab.wrap(host, argv),
                env={**os.environ, MARKER: host.marker},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        daemon = _Daemon(f"{what} on {host.name}", process, log)
        self._on_nodes.append(daemon)
        return daemon

    def _start_munged(self) -> None:
        munge_dir = self._munge_dir
        munge = pwd.getpwnam("munge")
        key = munge_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        for path in (munge_dir, key):
            os.chown(path, munge.pw_uid, munge.pw_gid)
        munge_dir.chmod(0o755)
        key.chmod(0o400)
        log = munge_dir / "munged.log"
        daemon = self._spawn(
            "munged",
            [
                str(SBIN / "munged"), "--foreground", f"--key-file={key}",
                f"--socket={self.munge_socket}", f"--pid-file={munge_dir / 'munged.pid'}",
                f"--seed-file={munge_dir / 'munged.seed'}", f"--log-file={log}",
                # The temp dir's parents are not munge's to vouch for.
                "--force",
            ],
            self.base_dir / "munged.out",
            user=munge.pw_uid,
            group=munge.pw_gid,
        )  # fmt: skip
        self._wait(lambda: self.munge_socket.exists(), daemon, "munged's socket")

    def _start_slurmctld(self) -> None:
        daemon = self._spawn(
            "slurmctld",
            [str(SBIN / "slurmctld"), "-D", "-i", "-f", str(self.conf_path)],
            self.base_dir / "slurmctld.out",
        )
        self._wait(lambda: _answers(self.lab.gateway, self.ctld_port), daemon, "slurmctld")

    def start_slurmd(self, node: str) -> None:
        host = self.hosts[node]
        self._slurmd[node] = self._spawn_on(
            host, "slurmd", [str(SBIN / "slurmd"), "-D", "-f", str(NODE_CONF), "-N", node]
        )

    def _wait(self, ready: object, daemon: _Daemon, what: str) -> None:
        assert callable(ready)
        deadline = time.monotonic() + _READY_SECONDS
        while not ready():
            if daemon.process.poll() is not None:
                raise SlurmClusterError(f"{what} exited: {_tail(daemon.log)}")
            if time.monotonic() > deadline:
                raise SlurmClusterError(f"{what} not ready after {_READY_SECONDS}s")
            time.sleep(0.05)

    def close(self) -> None:
        """End every daemon started here (by pid) and the nodes; idempotent."""
        errors: list[str] = []
        if self.login is not None:
            self.lab.remove_host(self.login)
            self.login = None
        for host in list(self.hosts.values()):
            # Its daemons and job steps end with it.
            self.lab.remove_host(host)
        self.hosts.clear()
        for daemon in [*reversed(self._daemons), *self._on_nodes]:
            if not _end(daemon.process):
                errors.append(daemon.what)
        self._daemons.clear()
        self._on_nodes.clear()
        self._slurmd.clear()
        shutil.rmtree(self._munge_dir, ignore_errors=True)
        if errors:
            raise SlurmClusterError(f"survived SIGKILL: {errors}")

    # looking at the cluster

    def command(self, *argv: str, timeout: float = 30) -> str:
        # In the cluster's own dir: a batch job's default output file lands there.
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            env=self.env(),
            cwd=self.base_dir,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise SlurmClusterError(f"{' '.join(argv)}: {done.stderr.strip()}")
        return done.stdout

    def sbatch(self, *argv: str) -> str:
        """Someone's batch job submitted from here; its Slurm job id. It runs in /tmp and
        writes no output file: this machine's folders do not exist on the nodes."""
        return self.command(
            "sbatch", "--parsable", "--chdir=/tmp", "--output=/dev/null", *argv
        ).strip()

    def ended_as(self, slurm_job: str) -> str:
        """The state an allocation ended in, as Slurm's accounting records it (``sacct``);
        "" while it has not ended (or its end has not reached the database yet)."""
        out = self.command("sacct", "-a", "-n", "-X", "-P", "-o", "State", "-j", slurm_job)
        shown = out.strip().split()
        # "CANCELLED by 0": the state is the first word.
        state = shown[0] if shown else ""
        live = ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "REQUEUED", "SUSPENDED")
        return "" if state in live else state

    def node_states(self) -> dict[str, str]:
        out = self.command("sinfo", "-h", "-N", "-o", "%N %T")
        return dict(line.split() for line in out.splitlines() if line.strip())  # type: ignore[misc]

    def wait_nodes_idle(self, nodes: Sequence[str], timeout: float = _READY_SECONDS) -> None:
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            with contextlib.suppress(SlurmClusterError):
                states = self.node_states()
                if all(states.get(n) == "idle" for n in nodes):
                    return
            for node in nodes:
                daemon = self._slurmd.get(node)
                if daemon is not None and daemon.process.poll() is not None:
                    raise SlurmClusterError(f"slurmd {node} exited: {self._node_log(node)}")
            time.sleep(0.1)
        raise SlurmClusterError(f"nodes not idle after {timeout}s: {states}")

    def _node_log(self, node: str) -> str:
        daemon = self._slurmd[node]
        try:
            text = self.hosts[node].read_text(NODE_LOG)
        except (FileNotFoundError, OSError):
            return _tail(daemon.log)
        return " | ".join(text.splitlines()[-15:])

    def queue(self) -> list[str]:
        """Every job still in squeue (id, name, state)."""
        out = self.command("squeue", "-h", "-o", "%i %j %T")
        return [line.strip() for line in out.splitlines() if line.strip()]

    def hold_nodes(self, partition: str, nodes: int, timeout: float = 30) -> str:
        """Someone else's job holding ``nodes`` whole nodes of ``partition``, running once this
        returns; its Slurm job id."""
        held = self.sbatch(
            "-p", partition, "-N", str(nodes), "--exclusive", "-J", "someone-else",
            "--wrap", "sleep 300",
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while f"{held} someone-else RUNNING" not in self.queue():
            if time.monotonic() > deadline:
                self.command("scancel", held)
                raise SlurmClusterError(f"someone else's job {held} did not run: {self.queue()}")
            time.sleep(0.2)
        return held


def _controller_host() -> str:
    return socket.gethostname().split(".")[0]


def _login_user() -> str:
    # Who the login node's jobs run as (the lab's hosts log in as this machine's user).
    return pwd.getpwuid(os.geteuid()).pw_name


def _free_port(address: str) -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


def _answers(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def _end(process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            try:
                process.wait(timeout=_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                return False
    return True


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# -- pytest fixtures -------------------------------------------------------------------------------

DEFAULT_NODES = (
    NodeShape("gpu1", cpus=4, memory_mb=4000, gres="gpu:a100:2"),
    NodeShape("gpu2", cpus=4, memory_mb=4000, gres="gpu:a100:2"),
    NodeShape("cpu1", cpus=2, memory_mb=2000),
    NodeShape("cpu2", cpus=2, memory_mb=2000),
)
DEFAULT_PARTITIONS = (
    PartitionShape("gpu", ("gpu1", "gpu2"), max_time="2:00:00"),
    PartitionShape("cpu", ("cpu1", "cpu2"), max_time="30:00", default=True),
)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """One cluster for the whole session: 2 nodes with 2 a100 each, 2 CPU nodes, a login node."""
    why = usable()
    if why is not None:
        pytest.skip(why)
    base = tmp_path_factory.mktemp("slurm")
    lab = SshdLab.create(base / "lab", mode="rootfs")
    cluster = SlurmCluster(lab, base / "cluster", DEFAULT_NODES, DEFAULT_PARTITIONS)
    try:
        cluster.start()
        yield cluster
    finally:
        try:
            cluster.close()
        finally:
            lab.close()
    left = lab.leftovers()
    if left:
        raise SlurmClusterError(f"slurm cluster left behind: {left}")
