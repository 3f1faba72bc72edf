"""Real server and worker processes on loopback, and a private PostgreSQL cluster, for tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from gpulayer.control.store import Store
from gpulayer.errors import ControlPlaneError
from gpulayer.protocol.client import ControlClient

ADMIN_TOKEN = "test-admin-token-0123456789"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _gpulayer(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpulayer", *args]


class ServerProcess:
    def __init__(
        self,
        home: Path,
        *,
        database_url: str | None = None,
        port: int | None = None,
        heartbeat_timeout: float = 3.0,
        host: str = "127.0.0.1",
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.home = home
        self.host = host
        self.extra_args = extra_args
        self.database_url = database_url
        self.port = port or free_port()
        self.heartbeat_timeout = heartbeat_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.url = f"http://{host}:{self.port}"

    @contextmanager
    def store(self) -> Iterator[Store]:
        """The server's own store, opened beside it to check what it wrote."""
        store = Store(self.database_url or f"sqlite:///{self.home / 'server.db'}")
        try:
            yield store
        finally:
            store.close()

    def start(self) -> ServerProcess:
        args = [
            "server",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--heartbeat-timeout",
            str(self.heartbeat_timeout),
        ]
        if self.database_url:
            args += ["--database-url", self.database_url]
        args += self.extra_args
        self.home.mkdir(parents=True, exist_ok=True)
        log = (self.home / "server.log").open("ab")
        env = {**os.environ, "GPULAYER_HOME": str(self.home), "GPULAYER_TOKEN": ADMIN_TOKEN}
        self.process = subprocess.Popen(
            _gpulayer(*args), stdout=log, stderr=log, env=env, start_new_session=True
        )
        log.close()
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        client = self.client()
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(
                    f"server exited: {(self.home / 'server.log').read_text()[-2000:]}"
                )
            try:
                client.health(timeout=1)
                return
            except ControlPlaneError:
                time.sleep(0.1)
        raise RuntimeError(f"server not ready: {(self.home / 'server.log').read_text()[-2000:]}")

    def client(self, token: str = ADMIN_TOKEN) -> ControlClient:
        return ControlClient(self.url, token, timeout=60)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, sig)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=15)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


class WorkerProcess:
    def __init__(
        self,
        server_url: str,
        token: str,
        home: Path,
        name: str,
        labels: dict[str, str] | None = None,
        wrapper: tuple[str, ...] = (),
    ) -> None:
        self.server_url = server_url
        self.token = token
        self.home = home
        self.name = name
        self.labels = labels or {}
        self.wrapper = wrapper
        """A command line the worker's own is appended to (it must exec it, keeping the pid)."""
        self.process: subprocess.Popen[bytes] | None = None
        self._mount_points: list[Path] = []
        """Empty folders made for reachable_interpreter, removed once the worker stopped."""

    def start(self, heartbeat_seconds: float = 0.5, *extra: str) -> WorkerProcess:
        self.home.mkdir(parents=True, exist_ok=True)
        token_file = self.home / "join.token"
        token_file.write_text(self.token + "\n")
        token_file.chmod(0o600)
        args = [
            "worker",
            "start",
            "--server",
            self.server_url,
            "--token-file",
            str(token_file),
            "--name",
            self.name,
            *extra,
        ]
        args += ["--heartbeat-seconds", str(heartbeat_seconds)]
        for key, value in self.labels.items():
            args += ["--label", f"{key}={value}"]
        log = (self.home / "worker.log").open("ab")
        env = {
            k: v for k, v in os.environ.items() if k not in ("GPULAYER_SERVER", "GPULAYER_TOKEN")
        }
        env["GPULAYER_HOME"] = str(self.home)
        wrapper = self.wrapper
        if "--run-as-range" in extra and os.geteuid() == 0:
            reachable = reachable_interpreter()
            if reachable:
                self._mount_points.append(Path(reachable[-1]))
            wrapper = (*wrapper, *reachable)
        self.process = subprocess.Popen(
            [*wrapper, *_gpulayer(*args)],
            stdout=log,
            stderr=log,
            env=env,
            start_new_session=True,
        )
        log.close()
        return self

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def kill_everything(self) -> None:
        """kill -9 the worker and every process of its session (its jobs too)."""
        if self.process is None:
            return
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=15)

    def stop(self) -> None:
        try:
            self._stop()
        finally:
            if self.process is None or self.process.poll() is not None:
                for folder in self._mount_points:
                    with contextlib.suppress(OSError):
                        folder.rmdir()

    def _stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGCONT)
        self.process.terminate()
        try:
            self.process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            self.kill_everything()
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)  # any job process left behind


def reachable_interpreter() -> tuple[str, ...]:
    """A wrapper for WorkerProcess that runs the worker through this interpreter's install
    bind-mounted, in a mount namespace of the worker's own, at a folder every user can reach:
    the test's interpreter lies under a home closed to others (/root), which a worker with
    --run-as-range refuses (its uids could not run a `python` job). Needs root."""
    if all(p.stat().st_mode & 0o001 for p in Path(sys.executable).parents):
        return ()
    mount_point = Path(tempfile.mkdtemp(prefix="gpulayer-python-"))
    mount_point.chmod(0o755)
    # Its libpython is found by an absolute RUNPATH under the closed home: pointed at anew.
    bind_then_run = (
        'mount --bind "$0" "$1" && p="$1/bin/${2##*/}" && export LD_LIBRARY_PATH="$1/lib" '
        '&& shift 2 && exec "$p" "$@"'
    )
    return ("unshare", "--mount", "--propagation", "private", "sh", "-c", bind_then_run,
            sys.base_prefix, str(mount_point))  # fmt: skip


def without_cgroup_v2() -> tuple[str, ...]:
    """A wrapper for WorkerProcess that gives the worker a mount namespace of its own without
    the cgroup v2 hierarchy, as on a machine where it has none: the worker falls back to being
    a subreaper. Needs root."""
    from gpulayer.worker.containment import cgroup2_mount

    mount = cgroup2_mount()
    if mount is None:
        return ()
    unmount_then_run = 'umount -l "$0" && exec "$@"'
    return ("unshare", "--mount", "--propagation", "private", "sh", "-c", unmount_then_run,
            str(mount))  # fmt: skip


def wait_for_workers(
    client: ControlClient, count: int, timeout: float = 60
) -> list[dict[str, object]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = [w for w in client.workers() if w["state"] == "ready"]
        if len(ready) >= count:
            return ready
        time.sleep(0.1)
    raise AssertionError(f"only {len(client.workers())} workers registered")


def wait_for_job(
    client: ControlClient, job_id: str, states: set[str], timeout: float = 60
) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    job: dict[str, object] = {}
    while time.monotonic() < deadline:
        job = client.job(job_id)
        if job["state"] in states:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} never reached {states}: {job}")


# --- PostgreSQL ---------------------------------------------------------------------------------


def postgres_bin() -> Path | None:
    root = Path("/usr/lib/postgresql")
    if not root.is_dir():
        return None
    versions = sorted(
        (p for p in root.iterdir() if (p / "bin" / "initdb").exists()), key=lambda p: p.name
    )
    return versions[-1] / "bin" if versions else None


@contextmanager
def postgres_cluster() -> Iterator[str]:
    """A throwaway PostgreSQL server on loopback; yields its SQLAlchemy URL."""
    import tempfile

    binaries = postgres_bin()
    if binaries is None:
        raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
    # Its own folder outside pytest's 0700 tree, so the postgres user can reach it.
    base = Path(tempfile.mkdtemp(prefix="gpulayer-pg-"))
    base.chmod(0o755)
    data = base / "pgdata"
    sockets = base / "pgsock"
    sockets.mkdir(parents=True, exist_ok=True)
    port = free_port()
    as_postgres: list[str] = []
    if os.geteuid() == 0:  # the server refuses to run as root
        shutil.chown(base, "postgres")
        shutil.chown(sockets, "postgres")
        as_postgres = ["runuser", "-u", "postgres", "--"]
    subprocess.run(
        [
            *as_postgres,
            str(binaries / "initdb"),
            "-D",
            str(data),
            "-U",
            "gpulayer",
            "--auth=trust",
            "-E",
            "UTF8",
        ],
        check=True,
        capture_output=True,
    )
    options = (
        f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
    )
    subprocess.run(
        [
            *as_postgres,
            str(binaries / "pg_ctl"),
            "-D",
            str(data),
            "-o",
            options,
            "-l",
            str(base / "pg.log"),
            "-w",
            "start",
        ],
        check=True,
        capture_output=True,
    )
    try:
        subprocess.run(
            [
                str(binaries / "createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-U",
                "gpulayer",
                "gpulayer",
            ],
            check=True,
            capture_output=True,
        )
        yield f"postgresql+psycopg://gpulayer@127.0.0.1:{port}/gpulayer"
    finally:
        subprocess.run(
            [
                *as_postgres,
                str(binaries / "pg_ctl"),
                "-D",
                str(data),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
            capture_output=True,
        )
        shutil.rmtree(base, ignore_errors=True)


@contextmanager
def server_on(database: str, home: Path, **options: object) -> Iterator[ServerProcess]:
    """A started server over "sqlite" (its own file) or "postgresql" (a throwaway cluster)."""
    if database == "postgresql" and postgres_bin() is None:
        raise RuntimeError(
            "PostgreSQL is not installed: .ci/run installs it (apt-get install postgresql)"
        )
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(postgres_cluster()) if database == "postgresql" else None
        process = ServerProcess(home, database_url=url, **options).start()  # type: ignore[arg-type]
        try:
            yield process
        finally:
            process.stop()
