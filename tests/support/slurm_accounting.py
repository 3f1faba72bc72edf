"""Slurm accounting for the test cluster: slurmdbd over a MariaDB server of the cluster's own, so
``sacct`` tells how each allocation ended (COMPLETED, CANCELLED, PREEMPTED, NODE_FAIL...) long
after squeue has forgotten it.

Debian's ``mariadb-server`` and ``slurmdbd`` run as children of the test process with their own
data dir, socket, ports and config below the cluster's base dir: the machine's own MariaDB
service, /etc/mysql and /etc/slurm are never read or touched. The database listens on loopback
only; slurmdbd on the lab bridge's address, where slurmctld and the login node's ``sacct`` reach
it.
"""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SBIN = Path("/usr/sbin")
_DATABASE = "slurm_acct_db"
_DB_USER = "slurm"

Spawn = Callable[[str, list[str], Path], subprocess.Popen[bytes]]
"""Starts a daemon of the cluster (what, argv, log) and keeps it to end at close."""
Wait = Callable[[Callable[[], bool], subprocess.Popen[bytes], str], None]
"""Waits, bounded, until the daemon is ready, failing with its log when it exits first."""


def accounting_installed() -> bool:
    return (
        (SBIN / "slurmdbd").exists()
        and (SBIN / "mariadbd").exists()
        and bool(shutil.which("mariadb-install-db"))
    )


@dataclass(eq=False)
class SlurmAccounting:
    base_dir: Path
    address: str
    """Where slurmdbd listens: the address slurmctld and the nodes reach this machine on."""
    db_port: int = field(default=0, init=False)
    dbd_port: int = field(default=0, init=False)
    _password: str = field(default_factory=lambda: secrets.token_hex(16), init=False)

    @property
    def _db_dir(self) -> Path:
        return self.base_dir / "mariadb"

    @property
    def _db_socket(self) -> Path:
        return self._db_dir / "mysqld.sock"

    def choose_ports(self) -> None:
        self.db_port = _free_port("127.0.0.1")
        self.dbd_port = _free_port(self.address)

    def slurm_conf_lines(self, munge_socket: Path) -> list[str]:
        """What slurm.conf says so that slurmctld records every job through slurmdbd (and
        sacct, sacctmgr find it)."""
        return [
            "AccountingStorageType=accounting_storage/slurmdbd",
            f"AccountingStorageHost={self.address}",
            f"AccountingStoragePort={self.dbd_port}",
            # Not a password with slurmdbd: the munged socket its connections authenticate
            # with (AuthInfo's is not read for them).
            f"AccountingStoragePass={munge_socket}",
        ]

    def start_database(self, spawn: Spawn, wait: Wait) -> None:
        """An empty MariaDB of its own (run as root, which ``--user=root`` allows: the data dir
        lies in the tests' private temp dirs), with the one user slurmdbd logs in as."""
        data = self._db_dir / "data"
        data.mkdir(parents=True)
        subprocess.run(
            ["mariadb-install-db", "--no-defaults", "--user=root", f"--datadir={data}",
             "--auth-root-authentication-method=socket", "--skip-test-db"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        server = spawn(
            "mariadbd",
            [str(SBIN / "mariadbd"), "--no-defaults", "--user=root", f"--datadir={data}",
             f"--socket={self._db_socket}", "--bind-address=127.0.0.1",
             f"--port={self.db_port}", f"--pid-file={self._db_dir / 'mariadbd.pid'}",
             f"--log-error={self._db_dir / 'error.log'}", "--skip-log-bin",
             "--innodb-buffer-pool-size=32M"],
            self._db_dir / "mariadbd.out",
        )  # fmt: skip
        wait(self._db_socket.exists, server, "mariadbd")
        # On stdin: the password stays out of every process's arguments.
        grant = (
            f"CREATE USER '{_DB_USER}'@'127.0.0.1' IDENTIFIED BY '{self._password}';\n"
            f"GRANT ALL ON {_DATABASE}.* TO '{_DB_USER}'@'127.0.0.1';\n"
        )
        subprocess.run(
            ["mariadb", "--no-defaults", f"--socket={self._db_socket}", "-u", "root"],
            input=grant.encode(), check=True, capture_output=True, timeout=30,
        )  # fmt: skip

    def start_slurmdbd(
        self, spawn: Spawn, wait: Wait, *, conf_dir: Path, controller_host: str, munge_socket: Path
    ) -> None:
        """slurmdbd reading ``conf_dir/slurmdbd.conf`` (beside the cluster's slurm.conf, where
        it looks for it), ready once it answers on its port."""
        logs = self.base_dir / "log"
        logs.mkdir(exist_ok=True)
        conf = conf_dir / "slurmdbd.conf"
        conf.touch(mode=0o600)
        conf.write_text(
            "\n".join(
                [
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={munge_socket}",
                    f"DbdHost={controller_host}",
                    f"DbdAddr={self.address}",
                    f"DbdPort={self.dbd_port}",
                    "SlurmUser=root",
                    f"PidFile={self.base_dir / 'slurmdbd.pid'}",
                    f"LogFile={logs / 'slurmdbd.log'}",
                    "StorageType=accounting_storage/mysql",
                    "StorageHost=127.0.0.1",
                    f"StoragePort={self.db_port}",
                    f"StorageUser={_DB_USER}",
                    f"StoragePass={self._password}",
                    f"StorageLoc={_DATABASE}",
                ]
            )
            + "\n"
        )
        daemon = spawn("slurmdbd", [str(SBIN / "slurmdbd"), "-D"], self.base_dir / "slurmdbd.out")
        wait(lambda: _answers(self.address, self.dbd_port), daemon, "slurmdbd")

    def register(self, command: Callable[..., str], cluster: str, users: Sequence[str]) -> None:
        """The cluster, an account and its users in the database, before slurmctld starts
        (its jobs are then recorded under them)."""
        command("sacctmgr", "-i", "add", "cluster", cluster)
        command("sacctmgr", "-i", "add", "account", "lab", f"Cluster={cluster}")
        for user in dict.fromkeys(users):
            command("sacctmgr", "-i", "add", "user", user, "Account=lab", f"Cluster={cluster}")


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
