"""Warm interpreters: a worker's pool of processes that run function jobs' items one at a
time, so that the items of a map import the user's module once rather than once each.

A process serves only items that agree on everything it was started with: the interpreter
(the setup's environment), the uid it runs as, the source (bundle digest or folder), the
function, and the environment less what is each attempt's own (its ids, folders, tag and
array index). Each item is still one attempt of its own job: it brings its own stdout and
stderr pipes, environment, working folder and result file (see warm_shim). Where attempts
have cgroups the process has one of its own, named like an attempt's so that the worker's
sentinel and sweep end it with theirs, and whatever an item starts is born there; elsewhere
what an item starts carries its attempt's tag. Either way the item's processes are found
and end with it.

A process is given back to the pool only after an item that returned and left nothing
running; one that crashed, timed out, was cancelled or left processes behind is ended with
its item's tree, and the next item gets a fresh one. Idle processes go after
IDLE_SECONDS, or when more than MAX_IDLE wait. A worker whose attempts each run as a uid
of their own (a run-as range) has no pool: its items run as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import os
import select
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Protocol

from gpulayer.protocol.bundle import BundleError, extract_bundle
from gpulayer.spec.models import FunctionWorkload
from gpulayer.worker.containment import TAG_VARIABLE, AttemptGroup, Containment
from gpulayer.worker.process import ProcessTree, RunAs

if TYPE_CHECKING:
    from gpulayer.spec.models import JobSpec


class AttemptPlace(Protocol):
    """What the pool reads of an attempt (the runner's RunContext has it)."""

    spec: JobSpec
    job_dir: Path
    bundle: Path | None
    source_dir: Path | None
    group: AttemptGroup | None
    run_as: RunAs | None


log = logging.getLogger("gpulayer.worker")

WARM_SHIM = Path(__file__).with_name("warm_shim.py")
IDLE_SECONDS = 60.0
MAX_IDLE = 8
_HEADER = 8
# Each attempt's own values: never part of what a process is started with, nor of its key.
PER_ITEM_NAMES = frozenset(
    {
        "GPULAYER_JOB_ID",
        "GPULAYER_ATTEMPT",
        "GPULAYER_ARRAY_INDEX",
        "SLURM_ARRAY_TASK_ID",
        TAG_VARIABLE,
    }
)


@dataclass(frozen=True)
class WarmKey:
    python: str
    uid: int | None
    source: str
    entrypoint: str
    environment: str
    """sha256 of the start environment: secrets and all, never shown."""


def start_environment(env: Mapping[str, str], attempt_dir: Path) -> dict[str, str]:
    """What a warm process starts with: the item's environment less its attempt's own names
    and every value that lies in its attempt's folder (its output, input, temp folders)."""
    inside = str(attempt_dir)
    return {
        name: value
        for name, value in env.items()
        if name not in PER_ITEM_NAMES and inside not in value
    }


# What a job is given of the machine's GPUs (see attempt_env.device_env).
_DEVICE_NAMES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def devices_of(env: Mapping[str, str]) -> frozenset[str]:
    """The GPUs an environment gives its process ("cuda:0", ...); none for a CPU job."""
    return frozenset(
        f"{name}:{index.strip()}"
        for name in _DEVICE_NAMES
        for index in env.get(name, "").split(",")
        if index.strip()
    )


def _digest(env: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(sorted(env.items())).encode()).hexdigest()


class OutOfTurn(Exception):
    """A warm process answered for an item it was not given: its channel is not trusted."""


class _ProcessGroup(AttemptGroup):
    """A warm process's cgroup, made as an attempt's is, under a name no attempt has."""

    def __init__(self, containment: Containment, name: str) -> None:
        self.containment = containment
        self.tag = f"{containment.key}:{name}"
        assert containment.root is not None
        self.directory: Path | None = containment.root / f"a{name}"
        self.directory.mkdir(parents=True, exist_ok=True)


class _Pipes:
    """The item's read ends, where a ProcessTree has its Popen's."""

    def __init__(self, stdout: int, stderr: int) -> None:
        self.stdout: IO[bytes] | None = os.fdopen(stdout, "rb", buffering=0)
        self.stderr: IO[bytes] | None = os.fdopen(stderr, "rb", buffering=0)

    def close(self) -> None:
        for pipe in (self.stdout, self.stderr):
            if pipe is not None:
                pipe.close()


class WarmProcess:
    """One warm interpreter: its process tree, its channel, its folder and cgroup."""

    def __init__(
        self,
        key: WarmKey,
        tree: ProcessTree,
        channel: socket.socket,
        folder: Path,
        cgroup: AttemptGroup | None,
    ) -> None:
        self.key = key
        self.tree = tree
        self.channel = channel
        self.folder = folder
        self.cgroup = cgroup
        self.items = 0
        self.devices: frozenset[str] = frozenset()
        self.idle_since = time.monotonic()
        self._replies = b""
        self._pidfd: int | None = None
        with contextlib.suppress(OSError, AttributeError):
            self._pidfd = os.pidfd_open(tree.pid)

    @property
    def pid(self) -> int:
        return self.tree.pid

    def send(self, item: int, env: Mapping[str, str], cwd: Path) -> _Pipes:
        """Hand the process one item; the read ends of its stdout and stderr."""
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        try:
            body = json.dumps({"id": item, "env": dict(env), "cwd": str(cwd)}).encode()
            socket.send_fds(
                self.channel, [len(body).to_bytes(_HEADER, "little")], [out_write, err_write]
            )
            self.channel.sendall(body)
        except OSError:
            for fd in (out_read, err_read):
                os.close(fd)
            raise
        finally:
            os.close(out_write)
            os.close(err_write)
        self.items += 1
        return _Pipes(out_read, err_read)

    def reply(self, item: int) -> int | None:
        """The item's exit code once the process answered, else None (never blocks). An
        answer for another item means the channel cannot be trusted: the process is ended."""
        # A reset channel is a process that ended: its exit code tells the item's end.
        with contextlib.suppress(BlockingIOError, InterruptedError, ConnectionError):
            self._replies += self.channel.recv(4096, socket.MSG_DONTWAIT)
        if b"\n" not in self._replies:
            return None
        line, _, self._replies = self._replies.partition(b"\n")
        fields = line.split()
        if len(fields) != 2 or fields[0] != str(item).encode() or self._replies:
            raise OutOfTurn("the warm process answered out of turn")
        try:
            return int(fields[1])
        except ValueError:
            raise OutOfTurn("the warm process answered out of turn") from None

    def wait(self, timeout: float, wake_fd: int | None) -> None:
        poller = select.poll()
        for fd in (self.channel.fileno(), self._pidfd, wake_fd):
            if fd is not None:
                poller.register(fd, select.POLLIN)
        poller.poll(max(0, round(timeout * 1000)))

    def end(self, grace: float) -> None:
        """End the process and all it left; reap it, remove its cgroup and folder."""
        with contextlib.suppress(OSError):
            self.channel.close()  # an idle shim exits on its own at end of file
        self.tree.terminate(grace)
        self.tree.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        if self.cgroup is not None:
            self.cgroup.kill()  # what outlived its SIGKILL, which a cgroup holds still
            self.cgroup.close()
        _remove_tree(self.folder)


def _remove_tree(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)


class WarmItem:
    """One item running in a warm process, supervised as a ProcessTree is (see JobRun)."""

    sees_exit = True

    def __init__(self, pool: WarmPool, process: WarmProcess, pipes: _Pipes) -> None:
        self.pool = pool
        self.process = process
        self.pid = process.pid
        self.popen = pipes
        self._item = process.items
        self._code: int | None = None
        self._answered = False
        self._ended = False

    def exited(self) -> int | None:
        """The item's exit code once the process answered, or the process's own once it
        ended without answering (a crash); else None."""
        if self._code is not None:
            return self._code
        if not self._ended:
            try:
                answer = self.process.reply(self._item)
            except OutOfTurn:
                self._ended = True  # it is ended, never given back
                answer = None
            if answer is not None:
                self._answered = True
                self._code = answer
                return answer
        self._code = self.process.tree.exited()
        if self._code is None and self._ended:
            self._code = 1
        return self._code

    def wait_exit(self, timeout: float, wake_fd: int | None = None) -> None:
        self.process.wait(timeout, wake_fd)

    def refresh(self) -> None:
        self.process.tree.refresh()

    def terminate(self, grace: float) -> int:
        """After an item that answered: the processes it left, ended with the warm process
        itself (0 when none, and the process stays warm). Otherwise end it all."""
        tree = self.process.tree
        if self._answered and not self._ended and tree.exited() is None:
            left = len(tree.members())
            if left == 0:
                return 0
            self._ended = True
            tree.terminate(grace)
            return left
        self._ended = True
        return tree.terminate(grace)

    def close(self) -> int:
        """Let go of the item's pipes; the process goes back to the pool, or is ended."""
        self.popen.close()
        self.process.tree.group = self.process.cgroup
        if self._answered and not self._ended:
            self.pool.give_back(self.process)
            return self._code or 0
        self.pool.retire(self.process, grace=0)
        if self._answered and self._code is not None:
            return self._code
        code = self.process.tree.popen.returncode
        return code if code is not None else 1


class WarmPool:
    """A worker's warm processes, by what they were started with."""

    def __init__(
        self,
        work_root: Path,
        containment: Containment | None,
        *,
        idle_seconds: float = IDLE_SECONDS,
        max_idle: int = MAX_IDLE,
        enabled: bool = True,
    ) -> None:
        """``enabled`` False: a worker whose attempts each run as a uid of their own (a process
        cannot change its uid between items), whose items run as before."""
        self.enabled = enabled
        self.root = work_root / ".warm"
        self.containment = containment
        self.idle_seconds = idle_seconds
        self.max_idle = max_idle
        self._idle: list[WarmProcess] = []
        self._busy: set[WarmProcess] = set()
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)
        self._closed = threading.Event()
        self._reaper: threading.Thread | None = None

    def item(
        self,
        ctx: AttemptPlace,
        *,
        python: str,
        cwd: Path,
        env: Mapping[str, str],
        note: Callable[[str], None],
        bundle_digest: str | None = None,
    ) -> WarmItem | None:
        """Start the attempt's function call in a warm process (an idle one of its key, else a
        new one). None when it cannot: a bundle without a digest, the pool closed, or no
        process could be started; the attempt then runs in a process of its own."""
        workload = ctx.spec.workload
        if not self.enabled or not isinstance(workload, FunctionWorkload):
            return None
        if (ctx.bundle is None and ctx.source_dir is None) or (
            ctx.bundle is not None and not bundle_digest
        ):
            return None  # no source that outlives the attempt, or none known by its digest
        bundle, folder = ctx.bundle, None if ctx.bundle is not None else cwd
        source_key = f"sha256:{bundle_digest}" if bundle is not None else f"dir:{cwd}"
        run_as, group = ctx.run_as, ctx.group
        base = start_environment(env, ctx.job_dir)
        key = WarmKey(
            python, run_as.uid if run_as else None, source_key, workload.entrypoint, _digest(base)
        )
        self.make_room(env, keep=key)
        for _ in range(2):  # an idle process may have died meanwhile: once more, fresh
            process = self._take(key)
            fresh = process is None
            if process is None:
                try:
                    process = self._spawn(key, base, bundle, folder, run_as)
                except OSError as exc:
                    note(f"no warm interpreter ({exc}); running the item in a process of its own")
                    return None
            if process is None:
                return None
            try:
                item = self._hand(process, env, cwd, group)
            except OSError:
                self.retire(process, grace=0)
                continue
            if fresh:
                note(f"in a new warm interpreter (pid {process.pid})")
            else:
                note(f"in a warm interpreter (pid {process.pid}, its item {process.items})")
            return item
        return None

    def entry(self, bundle_digest: str | None) -> WarmEntry:
        """The pool as one attempt uses it: with the digest its bundle is known by."""
        return WarmEntry(self, bundle_digest)

    def _hand(
        self, process: WarmProcess, env: Mapping[str, str], cwd: Path, group: AttemptGroup | None
    ) -> WarmItem:
        if process.tree.exited() is not None:
            raise OSError("the warm process has ended")
        # Without a cgroup of its own, the item's processes are found by its attempt's tag.
        process.tree.group = process.cgroup or group
        pipes = process.send(process.items + 1, env, cwd)
        return WarmItem(self, process, pipes)

    def _take(self, key: WarmKey) -> WarmProcess | None:
        with self._lock:
            for process in reversed(self._idle):
                if process.key == key:
                    self._idle.remove(process)
                    self._busy.add(process)
                    return process
        return None

    def _spawn(
        self,
        key: WarmKey,
        base: Mapping[str, str],
        bundle: Path | None,
        source_folder: Path | None,
        run_as: RunAs | None,
    ) -> WarmProcess | None:
        if self._closed.is_set():
            return None
        number = next(self._numbers)
        folder = self.root / str(number)
        _remove_tree(folder)  # an earlier life's
        folder.mkdir(parents=True, mode=0o700)
        home = source_folder or folder / "src"
        if bundle is not None:
            try:
                extract_bundle(bundle, home)
            except BundleError as exc:
                _remove_tree(folder)
                raise OSError(str(exc)) from None
        home.mkdir(exist_ok=True)
        if run_as is not None:
            run_as.own(folder)
        env = dict(base)
        if self.containment is not None:
            # Found and ended by the worker's sentinel if the worker dies (its prefix).
            env[TAG_VARIABLE] = f"{self.containment.key}:warm-{number}"
        parent, child = socket.socketpair()
        try:
            popen = subprocess.Popen(
                [key.python, str(WARM_SHIM), str(child.fileno()), str(home)],
                cwd=home,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
                pass_fds=(child.fileno(),),
                user=run_as.uid if run_as is not None else None,
                group=run_as.gid if run_as is not None else None,
                extra_groups=[] if run_as is not None else None,
            )
        except OSError:
            parent.close()
            _remove_tree(folder)
            raise
        finally:
            child.close()
        cgroup = self._own_cgroup(number, popen.pid)
        process = WarmProcess(key, ProcessTree(popen, cgroup), parent, folder, cgroup)
        process.devices = devices_of(base)
        with self._lock:
            self._busy.add(process)
        self._start_reaper()
        return process

    def _own_cgroup(self, number: int, pid: int) -> AttemptGroup | None:
        """The process's own cgroup, where what its items start is born: named like an
        attempt's ("a" first), so the sentinel of a worker that died, and its next life's
        sweep, end and remove it with theirs. None where attempts have no cgroups."""
        containment = self.containment
        if containment is None or containment.mode != "cgroup":
            return None
        try:
            group = _ProcessGroup(containment, f"-warm-{number}")
        except OSError:
            return None
        try:
            group.join(pid)  # before its first item: it has started nothing yet
        except OSError:
            group.close()
            return None
        return group

    def give_back(self, process: WarmProcess) -> None:
        process.idle_since = time.monotonic()
        extra: list[WarmProcess] = []
        with self._lock:
            self._busy.discard(process)
            if self._closed.is_set():
                extra.append(process)
            else:
                self._idle.append(process)
                while len(self._idle) > self.max_idle:
                    extra.append(self._idle.pop(0))
        for old in extra:
            old.end(1.0)

    def retire(self, process: WarmProcess, *, grace: float) -> None:
        with self._lock:
            self._busy.discard(process)
            with contextlib.suppress(ValueError):
                self._idle.remove(process)
        process.end(grace)

    def make_room(self, env: Mapping[str, str], keep: WarmKey | None = None) -> None:
        """End the idle processes that hold any GPU this environment gives its job: a model
        an earlier item left loaded there must not leave the next job short of memory. Those
        of ``keep``, the job's own key, stay for it to reuse."""
        wanted = devices_of(env)
        if not wanted:
            return
        with self._lock:
            holding = [p for p in self._idle if p.devices & wanted and p.key != keep]
            for process in holding:
                self._idle.remove(process)
        for process in holding:
            process.end(1.0)

    def pids(self) -> set[int]:
        with self._lock:
            return {p.pid for p in [*self._idle, *self._busy]}

    def _start_reaper(self) -> None:
        with self._lock:
            if self._reaper is not None:
                return
            self._reaper = threading.Thread(
                target=self._reap_idle, name="gpulayer-warm-reaper", daemon=True
            )
        self._reaper.start()

    def _reap_idle(self) -> None:
        while not self._closed.wait(min(5.0, self.idle_seconds)):
            now = time.monotonic()
            with self._lock:
                old = [p for p in self._idle if now - p.idle_since >= self.idle_seconds]
                for process in old:
                    self._idle.remove(process)
            for process in old:
                process.end(1.0)

    def close(self) -> None:
        """End the idle processes; busy ones end with their items."""
        self._closed.set()
        with self._lock:
            idle, self._idle = self._idle, []
        for process in idle:
            process.end(1.0)


class WarmEntry:
    """A pool and the digest of one attempt's bundle (which names its source in the key)."""

    def __init__(self, pool: WarmPool, bundle_digest: str | None) -> None:
        self.pool = pool
        self.bundle_digest = bundle_digest

    def make_room(self, env: Mapping[str, str]) -> None:
        self.pool.make_room(env)

    def item(
        self,
        ctx: AttemptPlace,
        *,
        python: str,
        cwd: Path,
        env: Mapping[str, str],
        note: Callable[[str], None],
    ) -> WarmItem | None:
        return self.pool.item(
            ctx, python=python, cwd=cwd, env=env, note=note, bundle_digest=self.bundle_digest
        )
