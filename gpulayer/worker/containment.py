"""Keeping every process of an attempt findable, so that none outlives it or its worker.

A job can leave its session and process group (``setsid``, double forks, ``nohup``), so the
session alone does not hold it. Two mechanisms, the strongest the machine allows:

* ``cgroup``: a cgroup v2 per attempt (where the worker may create them, usually as root). The
  worker moves the job's first process into it before that process execs (the child never
  holds a descriptor to the cgroup); every descendant stays in it whatever it
  does, and writing ``1`` to ``cgroup.kill`` ends them all at once.
* ``subreaper``: elsewhere the worker becomes a child subreaper, so orphaned descendants
  become its children instead of init's, and every job process carries the attempt's tag in
  its environment, by which it is found and ended.

A sentinel process (see :mod:`gpulayer.worker.sentinel`) outlives a worker killed with -9 and
ends that worker's attempts; a restarted worker sweeps what its previous life left.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

log = logging.getLogger("gpulayer.worker")

TAG_VARIABLE = "GPULAYER_ATTEMPT_TAG"
_PR_SET_CHILD_SUBREAPER = 36
_PROC = Path("/proc")
Mode = Literal["cgroup", "subreaper"]


def cgroup2_mount() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or beside v1 controllers)."""
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def worker_key(work_root: Path) -> str:
    """Names one worker's attempts on this machine: the same work dir after a restart."""
    return hashlib.sha256(str(work_root.resolve()).encode()).hexdigest()[:12]


def _tagged_pids(prefix: bytes) -> list[int]:
    """Processes whose environment carries a tag starting with prefix (``key:`` or ``key:id``)."""
    needle = TAG_VARIABLE.encode() + b"=" + prefix
    found = []
    me = os.getpid()
    for entry in os.scandir(_PROC):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (_PROC / entry.name / "environ").read_bytes()
        except OSError:
            continue
        for item in environ.split(b"\0"):
            if item.startswith(needle) and (prefix.endswith(b":") or item == needle):
                found.append(int(entry.name))
                break
    return found


def _kill_tagged(prefix: bytes, timeout: float = 10.0) -> int:
    """SIGKILL every tagged process until none is left (a dying parent may still fork)."""
    ended: set[int] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = [p for p in _tagged_pids(prefix) if _alive(p)]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            ended.add(pid)
        time.sleep(0.02)
    return len(ended)


def _alive(pid: int) -> bool:
    try:
        state = (_PROC / str(pid) / "stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X", "x")


def _read_all(fd: int, size: int) -> bytes:
    """Up to size bytes from a pipe, fewer only at end of file."""
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _read_pids(path: Path) -> list[int]:
    try:
        return [int(line) for line in path.read_text().split()]
    except (OSError, ValueError):
        return []


def _kill_cgroup(directory: Path, timeout: float = 10.0) -> int:
    """Write cgroup.kill and wait until the group is empty, then remove it."""
    pids = _read_pids(directory / "cgroup.procs")
    with contextlib.suppress(OSError):
        (directory / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and [p for p in _read_pids(directory / "cgroup.procs")]:
        time.sleep(0.01)
    with contextlib.suppress(OSError):
        directory.rmdir()
    return len(pids)


class AttemptGroup:
    """One attempt's processes: how its first process joins, how to list and end them all."""

    def __init__(self, containment: Containment, attempt_id: int) -> None:
        self.containment = containment
        self.tag = f"{containment.key}:{attempt_id}"
        self.directory: Path | None = None
        if containment.mode == "cgroup" and containment.root is not None:
            self.directory = containment.root / f"a{attempt_id}"
            self.directory.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def entering(self) -> Iterator[Callable[[], None] | None]:
        """A hook for the child between fork and exec that waits until the worker has moved
        it into the attempt's cgroup (None without one).

        The worker writes the child's pid into cgroup.procs itself: a descriptor to that file
        handed to the child would let a job running as another user move any process (the
        kernel checks a move against whoever opened the file)."""
        if self.directory is None:
            yield None
            return
        ready_read, ready_write = os.pipe()
        go_read, go_write = os.pipe()
        procs = self.directory / "cgroup.procs"
        errors: list[OSError] = []

        def move_child() -> None:
            # Whatever happens here, go_write is closed at the end: a child still waiting
            # then reads end of file and fails, rather than blocking its parent's Popen.
            try:
                data = _read_all(ready_read, 4)
                if len(data) != 4:
                    return  # the child ended before asking
                try:
                    procs.write_text(str(int.from_bytes(data, "little")))
                except OSError as exc:
                    errors.append(exc)
                    return
                os.write(go_write, b"1")
            finally:
                os.close(go_write)

        def enter() -> None:
            os.close(go_write)  # else a parent that never answers would block it forever
            os.close(ready_read)
            os.write(ready_write, os.getpid().to_bytes(4, "little"))
            if os.read(go_read, 1) != b"1":
                raise OSError("the worker could not move this process into its attempt's cgroup")

        mover = threading.Thread(target=move_child, name="gpulayer-cgroup-entry", daemon=True)
        mover.start()
        try:
            yield enter
        finally:
            os.close(ready_write)  # the mover sees end of file if no child ever asked
            os.close(go_read)
            mover.join()
            os.close(ready_read)
        if errors:
            raise errors[0]

    def join(self, pid: int) -> None:
        """Move a process (held before it execs the job) into the attempt's cgroup."""
        assert self.directory is not None
        (self.directory / "cgroup.procs").write_text(str(pid))

    def pids(self) -> set[int]:
        if self.directory is not None:
            return set(_read_pids(self.directory / "cgroup.procs"))
        return set(_tagged_pids(self.tag.encode()))

    def kill(self) -> None:
        """End every process of the attempt (already signalled gently by the caller)."""
        if self.directory is not None:
            _kill_cgroup(self.directory)
        else:
            _kill_tagged(self.tag.encode())

    def close(self) -> bool:
        """True when every process the attempt ever started is known to be gone: its cgroup
        (which none of them can leave) is empty and removed."""
        if self.directory is None:
            return False
        try:
            self.directory.rmdir()
        except OSError:
            return False
        return True


class Containment:
    """One worker's attempts on this machine."""

    def __init__(self, key: str, mode: Mode, root: Path | None) -> None:
        self.key = key
        self.mode: Mode = mode
        self.root = root
        self._sentinel: subprocess.Popen[bytes] | None = None

    @classmethod
    def for_worker(cls, work_root: Path, *, allow_cgroup: bool = True) -> Containment:
        key = worker_key(work_root)
        mount = cgroup2_mount() if allow_cgroup and sys.platform == "linux" else None
        if mount is not None:
            root = mount / "gpulayer" / key
            try:
                root.mkdir(parents=True, exist_ok=True)
                if (root / "cgroup.kill").exists():  # kernels before 5.14 lack it
                    return cls(key, "cgroup", root)
            except OSError:
                pass  # not ours to create (no root, or a read-only hierarchy)
        become_subreaper()
        return cls(key, "subreaper", None)

    def attempt(self, attempt_id: int) -> AttemptGroup:
        return AttemptGroup(self, attempt_id)

    def sweep(self) -> int:
        """End whatever an earlier life of this worker left running; how many processes."""
        return end_all(self.key, self.root)

    def start_sentinel(self) -> None:
        """A process that ends this worker's attempts once the worker is gone, however."""
        args = [sys.executable, "-m", "gpulayer.worker.sentinel", self.key]
        if self.root is not None:
            args.append(str(self.root))
        self._sentinel = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )

    def stop_sentinel(self) -> None:
        if self._sentinel is not None and self._sentinel.stdin is not None:
            self._sentinel.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._sentinel.wait(timeout=15)
            self._sentinel = None


def end_all(key: str, root: Path | None, *, remove_root: bool = False) -> int:
    """End every attempt of the worker with this key; how many processes there were."""
    ended = 0
    if root is not None:
        for child in _attempt_dirs(root):
            ended += _kill_cgroup(child)
        if remove_root:
            with contextlib.suppress(OSError):
                root.rmdir()
    ended += _kill_tagged(f"{key}:".encode())
    return ended


def _attempt_dirs(root: Path) -> Iterator[Path]:
    with contextlib.suppress(OSError):
        for child in root.iterdir():
            if child.is_dir() and child.name.startswith("a"):
                yield child


def become_subreaper() -> bool:
    """Orphaned descendants become this process's children rather than init's (Linux)."""
    if sys.platform != "linux":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def reap_orphans(keep: set[int]) -> None:
    """Collect exited children that are not ours to wait for (orphans a subreaper inherits)."""
    me = os.getpid()
    for entry in os.scandir(_PROC):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid in keep:
            continue
        try:
            fields = (_PROC / entry.name / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 1 and fields[0] == "Z" and int(fields[1]) == me:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
