"""A job's processes: start them in a session of their own, stream their output, end them all.

A job may fork freely (shell pipelines, data loader workers, torchrun's ranks), so ending the
job means ending its whole process tree, not just the process we started. The child leads a
new session and process group; on Linux we also follow descendants through /proc, which finds
the ones that moved to a session of their own while their parent still lived.

The leader is never reaped until the tree is gone: while it stays a zombie its pid, and so its
process group id, cannot be reused by an unrelated process that a late ``killpg`` would hit.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import logging
import os
import select
import selectors
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpulayer.procs import GONE_STATES, PROC, ProcStat, proc_table, read_stat

if TYPE_CHECKING:
    from gpulayer.worker.containment import AttemptGroup

_log = logging.getLogger(__name__)

LogSink = Callable[[str, str], None]
"""(stream, text): stream is "stdout", "stderr" or "system"."""


def tree_members(
    table: Iterable[ProcStat], leader: int, known: Mapping[int, int]
) -> dict[int, int]:
    """Pids (with start times) that belong to the tree led by ``leader``: its process group,
    its session, the processes already ``known`` (if still the same process) and all of
    their descendants. Zombies are left out: they are dead already."""
    live = [p for p in table if p.state not in GONE_STATES]
    members = {
        p.pid: p.start_time
        for p in live
        if p.pgrp == leader or p.session == leader or known.get(p.pid) == p.start_time
    }
    by_parent: dict[int, list[ProcStat]] = {}
    for p in live:
        by_parent.setdefault(p.ppid, []).append(p)
    frontier = list(members)
    while frontier:
        for child in by_parent.get(frontier.pop(), ()):
            if child.pid not in members:
                members[child.pid] = child.start_time
                frontier.append(child.pid)
    members.pop(leader, None)  # the leader is waited for, never signalled by pid
    return members


@dataclass(frozen=True)
class RunAs:
    """An unprivileged user a worker started as root runs its jobs as."""

    name: str
    uid: int
    gid: int
    home: str

    @classmethod
    def lookup(cls, name: str) -> RunAs:
        import pwd

        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise ValueError(f"--run-as: no user {name!r} on this machine") from None
        if entry.pw_uid == 0:
            raise ValueError(f"--run-as: {name!r} is root; name an unprivileged user")
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)

    def own(self, *paths: Path) -> None:
        """Give the user the attempt's directories (and what is in them)."""
        for top in paths:
            if not top.exists():
                continue
            os.chown(top, self.uid, self.gid)
            for root, dirs, files in os.walk(top):
                for name in [*dirs, *files]:
                    path = os.path.join(root, name)
                    with contextlib.suppress(OSError):
                        os.chown(path, self.uid, self.gid, follow_symlinks=False)


class ProcessTree:
    """A child started in a new session, and everything it spawns.

    With an attempt group (see :mod:`gpulayer.worker.containment`) the child joins it before
    it execs, and the group's members count as the tree's too: they are found and ended even
    after leaving the session with no living parent in it."""

    def __init__(self, popen: subprocess.Popen[bytes], group: AttemptGroup | None = None) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.group = group
        self._known: dict[int, int] = {}
        self._returncode: int | None = None
        self._can_scan = PROC.is_dir()
        self._pidfd = _pidfd_of(self.pid)
        """Readable once the leader has exited (None where the kernel has no pidfds)."""

    @classmethod
    def spawn(
        cls,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        group: AttemptGroup | None = None,
        run_as: RunAs | None = None,
    ) -> ProcessTree:
        if group is not None and group.directory is not None and _can_shim(argv):
            return cls._spawn_held(argv, cwd=cwd, env=env, group=group, run_as=run_as)
        entering = group.entering() if group is not None else contextlib.nullcontext(None)
        with entering as enter:
            try:
                popen = _start(argv, cwd, env, run_as, stdin=subprocess.DEVNULL, hook=enter)
            except subprocess.SubprocessError as exc:  # the hook failed in the child
                raise OSError(f"the job's process could not join its attempt: {exc}") from None
        return cls(popen, group)

    @classmethod
    def _spawn_held(
        cls,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        group: AttemptGroup,
        run_as: RunAs | None,
    ) -> ProcessTree:
        """Start the job through a shell that waits on its stdin until the worker has moved it
        into the attempt's cgroup, then execs the job with stdin on /dev/null. Without a
        Python hook between fork and exec, the fast spawn path stays open (a hook costs a
        worker about 4 ms of CPU a job)."""
        _check_runnable(argv[0], cwd, env, run_as)
        held = [_SHELL, "-c", _HOLD_UNTIL_JOINED, "gpulayer-job", *argv]
        popen = _start(held, cwd, env, run_as, stdin=subprocess.PIPE)
        assert popen.stdin is not None
        try:
            group.join(popen.pid)
        except OSError as exc:
            popen.stdin.close()  # the shell reads end of file and exits before the job starts
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()
            for pipe in (popen.stdout, popen.stderr):
                if pipe is not None:
                    pipe.close()
            raise OSError(f"the job's process could not join its attempt: {exc}") from None
        with contextlib.suppress(BrokenPipeError):  # killed meanwhile: its exit code says so
            popen.stdin.write(b"go\n")
            popen.stdin.close()
        popen.stdin = None
        return cls(popen, group)

    def exited(self) -> int | None:
        """The leader's return code once it has exited (negative: killed by that signal),
        else None. Does not reap it."""
        if self._returncode is None:
            try:
                info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:  # reaped already; Popen knows the code
                info = None
                self._returncode = self.popen.poll()
            if info is not None:
                code = info.si_status
                self._returncode = code if info.si_code == os.CLD_EXITED else -code
        return self._returncode

    @property
    def sees_exit(self) -> bool:
        """Whether :meth:`wait_exit` returns as soon as the leader exits; else only at its
        timeout or wake-up, and the caller polls."""
        return self._pidfd is not None

    def wait_exit(self, timeout: float, wake_fd: int | None = None) -> None:
        """Block until the leader exits (where :attr:`sees_exit`), ``wake_fd`` turns readable
        or ``timeout`` seconds pass, whichever is first. Reaps nothing."""
        fds = [fd for fd in (self._pidfd, wake_fd) if fd is not None]
        if not fds:
            time.sleep(timeout)
            return
        poller = select.poll()  # not select(): a busy worker's descriptors pass 1024
        for fd in fds:
            poller.register(fd, select.POLLIN)
        poller.poll(max(0, round(timeout * 1000)))

    def refresh(self) -> None:
        """Remember the tree's current members, so that those who leave the session are
        still found once their parent is gone. A cgroup remembers them itself."""
        if self._can_scan and not self._in_cgroup:
            self._known = tree_members(proc_table(), self.pid, self._known)

    @property
    def _in_cgroup(self) -> bool:
        return self.group is not None and self.group.directory is not None

    def members(self) -> dict[int, int]:
        """Live processes of the tree other than the leader."""
        if not self._can_scan:
            return {}
        if self._in_cgroup:
            return self._cgroup_members()
        table = proc_table()
        if self.group is not None:
            grouped = self.group.pids()
            for stat in table:
                if stat.pid in grouped and stat.state not in GONE_STATES:
                    self._known.setdefault(stat.pid, stat.start_time)
        self._known = tree_members(table, self.pid, self._known)
        return dict(self._known)

    def _cgroup_members(self) -> dict[int, int]:
        """The attempt's cgroup holds every process the job started (it joined before it
        exec'd, and its children are born into it), wherever they went in sessions and
        parents: its few members are read rather than every process of the machine, which
        cost a worker about 3 ms of CPU a job."""
        assert self.group is not None
        found = {}
        for pid in self.group.pids() - {self.pid}:
            stat = read_stat(pid)
            if stat is not None and stat.state not in GONE_STATES:
                found[pid] = stat.start_time
        return found

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)
        for pid, start_time in self.members().items():
            stat = read_stat(pid)
            if stat is not None and stat.start_time == start_time:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)

    def _all_gone(self) -> bool:
        return self.exited() is not None and not self.members()

    def _wait_gone(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while not self._all_gone():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def terminate(self, grace: float) -> int:
        """SIGTERM the whole tree, then SIGKILL whatever is left after ``grace`` seconds.
        Returns how many processes (leader included) were still running at the start."""
        running = len(self.members()) + (self.exited() is None)
        if self._can_scan and running == 0:
            return 0
        self._signal(signal.SIGTERM)
        if self._wait_gone(grace) and self._can_scan:
            return running
        # Without /proc the group's members cannot be seen, so it gets SIGKILL regardless
        # once the leader is gone or the grace is over; the unreaped leader keeps its id
        # from being reused meanwhile.
        self._signal(signal.SIGKILL)
        if self.group is not None:
            self.group.kill()
        self._wait_gone(10)
        return running

    def close(self) -> int:
        """Reap the leader and close our ends of its pipes; returns its exit code."""
        code = self.popen.wait()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        for pipe in (self.popen.stdout, self.popen.stderr):
            if pipe is not None:
                pipe.close()
        return code


def _pidfd_of(pid: int) -> int | None:
    """A descriptor that turns readable when ``pid`` (our unreaped child) exits: the job's end
    is seen at once rather than at the next poll, which held every short job's slot for the
    poll's interval (Linux 5.3 and later; None elsewhere)."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        return int(pidfd_open(pid))
    except OSError:
        return None


def _start(
    argv: Sequence[str],
    cwd: Path,
    env: Mapping[str, str],
    run_as: RunAs | None,
    *,
    stdin: int,
    hook: Callable[[], None] | None = None,
) -> subprocess.Popen[bytes]:
    # close_fds: nothing the worker opened (its logs, sockets, other jobs' pipes) reaches
    # the job; only 0-2, the job's own pipes.
    return subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        close_fds=True,
        preexec_fn=hook,
        user=run_as.uid if run_as is not None else None,
        group=run_as.gid if run_as is not None else None,
        extra_groups=[] if run_as is not None else None,
    )


_SHELL = "/bin/sh"
# `read` fails on end of file: the worker closed the pipe without saying go.
_HOLD_UNTIL_JOINED = 'read -r go || exit 126; exec </dev/null; exec "$@"'


def _can_shim(argv: Sequence[str]) -> bool:
    # A program named "-..." would read as an option of the shell's exec.
    return bool(argv) and not argv[0].startswith("-") and os.access(_SHELL, os.X_OK)


def _check_runnable(program: str, cwd: Path, env: Mapping[str, str], run_as: RunAs | None) -> None:
    """Refuse a program exec would not find, as Popen would itself: behind the shell, a
    missing program would be the job's exit 127 rather than a job that could not start."""
    if "/" in program:
        path: str | None = str(cwd / program)
        if not os.path.isfile(str(path)):
            path = None
    else:
        search = env.get("PATH", os.defpath)
        path = shutil.which(program, path=search)
        if path is None and run_as is not None:
            # Found by name yet not executable by the worker: the job's user may run it.
            path = next(
                (
                    str(Path(d) / program)
                    for d in search.split(os.pathsep)
                    if d and (Path(d) / program).is_file()
                ),
                None,
            )
    if path is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    if run_as is None and not os.access(path, os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)


class Redactor:
    """Replaces secret values with *** in text. Values shorter than ``min_length`` are
    left alone: masking every "1" or "ab" would wreck the logs and hide nothing."""

    MASK = "***"

    def __init__(self, secrets: Iterable[str], min_length: int = 4) -> None:
        needles: set[str] = set()
        for value in secrets:
            parts = [value, *value.splitlines()] if "\n" in value else [value]
            needles.update(p for p in (s.strip("\r\n") for s in parts) if len(p) >= min_length)
        # Longest first, so that a secret containing another is masked whole.
        self._needles = sorted(needles, key=len, reverse=True)

    def __bool__(self) -> bool:
        return bool(self._needles)

    def redact(self, text: str) -> str:
        for needle in self._needles:
            if needle in text:
                text = text.replace(needle, self.MASK)
        return text

    def unsafe_tail(self, text: str) -> int:
        """Length of the longest end of ``text`` that could be the start of a secret, which
        must wait for more output before it is shown."""
        longest = 0
        for needle in self._needles:
            for size in range(min(len(needle) - 1, len(text)), longest, -1):
                if text.endswith(needle[:size]):
                    longest = size
                    break
        return longest


class OutputPump:
    """Reads a child's stdout and stderr on one thread and hands them to ``sink`` line by
    line. A partial line is flushed once no more output came for ``flush_after`` seconds
    (progress bars, prompts), or when it grows past ``max_line`` characters."""

    def __init__(
        self,
        streams: Mapping[str, int],
        sink: LogSink,
        *,
        redactor: Redactor | None = None,
        flush_after: float = 0.2,
        max_line: int = 65536,
    ) -> None:
        self._fds = {fd: name for name, fd in streams.items()}
        self._sink = sink
        self._redactor = redactor or Redactor(())
        self._flush_after = flush_after
        self._max_line = max_line
        self._pending = {fd: "" for fd in self._fds}
        self._pending_since: dict[int, float] = {}
        self._decoders = {fd: codecs.getincrementaldecoder("utf-8")("replace") for fd in self._fds}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpulayer-output", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def finish(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for end of output, then stop reading. False when
        something outside the tree still held a pipe open."""
        if self._thread.ident is None:
            return True  # never started
        self._thread.join(timeout)
        drained = not self._thread.is_alive()
        self._stop.set()
        self._thread.join()
        return drained

    def _emit(self, fd: int, text: str) -> None:
        if not text:
            return
        try:
            self._sink(self._fds[fd], self._redactor.redact(text))
        except Exception:
            # A failing log sink must not stop the draining: a child blocked on a full pipe
            # would hang until its timeout.
            _log.exception("log sink failed")

    def _feed(self, fd: int, text: str) -> None:
        buffer = self._pending[fd] + text
        cut = buffer.rfind("\n") + 1
        if cut:
            start = 0
            while start < cut:  # only "\n" ends a line: a "\r" progress bar stays whole
                end = buffer.index("\n", start) + 1
                self._emit(fd, buffer[start:end])
                start = end
            buffer = buffer[cut:]
        if len(buffer) >= self._max_line:
            keep = self._redactor.unsafe_tail(buffer)
            self._emit(fd, buffer[: len(buffer) - keep])
            buffer = buffer[len(buffer) - keep :]
        self._pending[fd] = buffer
        if not buffer:
            self._pending_since.pop(fd, None)
        elif cut or fd not in self._pending_since:
            self._pending_since[fd] = time.monotonic()

    def _flush_stale(self, now: float, force: bool = False) -> None:
        for fd, since in list(self._pending_since.items()):
            if force or now - since >= self._flush_after:
                buffer = self._pending[fd]
                keep = 0 if force else self._redactor.unsafe_tail(buffer)
                self._emit(fd, buffer[: len(buffer) - keep])
                self._pending[fd] = buffer[len(buffer) - keep :]
                if keep:
                    self._pending_since[fd] = now
                else:
                    del self._pending_since[fd]

    def _run(self) -> None:
        # selectors, not select.select: a busy worker's pipes may have descriptors past 1024.
        with selectors.DefaultSelector() as selector:
            for fd in self._fds:
                selector.register(fd, selectors.EVENT_READ)
            try:
                while selector.get_map():
                    wait = self._flush_after if self._pending_since else 0.5
                    for key, _ in selector.select(wait):
                        fd = key.fd
                        data = os.read(fd, 65536)
                        self._feed(fd, self._decoders[fd].decode(data, final=not data))
                        if not data:
                            selector.unregister(fd)
                    self._flush_stale(time.monotonic())
                    if self._stop.is_set():
                        break
            finally:
                self._flush_stale(time.monotonic(), force=True)
