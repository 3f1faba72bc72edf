"""A uid of its own for every live attempt, taken from a range the worker owns.

Jobs that share one uid can read each other's ``/proc/<pid>/environ`` (secrets) and write into
each other's folders. With ``--run-as-range FIRST-LAST`` a worker running as root gives each
attempt the lowest uid of the range that no live attempt holds (its group id is the same
number), owns the attempt's folder to it with mode 0700, and takes the folder back once the
attempt has ended, so the next attempt that gets the uid finds nothing of the last one's.
The uids need no entry in /etc/passwd (as with systemd's DynamicUser); the range must hold
none that does, and at least as many uids as the worker runs attempts at once.

An attempt can leave more than its folder: a process that escaped its attempt's group (where
the worker has no cgroup, one that left its session and wiped its environment), files in the
folders every user may write to, SysV IPC objects, POSIX message queues, keys in its keyrings.
Before a uid goes back to the pool, every process running as it is ended, its IPC objects
are removed, its keyrings emptied, and its
files in every world-writable folder of the machine's local filesystems (found when the worker
starts: /tmp, /var/tmp, /dev/shm, /run/lock and any other) are removed; a worker that starts
again does the same for the whole range, whatever its earlier life left.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
import threading
import time
from collections.abc import Container
from dataclasses import dataclass
from pathlib import Path

from gpulayer.errors import GpulayerError
from gpulayer.worker.disk import attempt_folders
from gpulayer.worker.ipc_hygiene import (
    clear_keyrings_of,
    mqueue_folder,
    remove_mqueues_of,
    remove_sysv_of,
)

log = logging.getLogger("gpulayer.worker")

FLAG = "--run-as-range"
SHARED_TEMP_FOLDERS = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"), Path("/run/lock"))
"""Always cleared; the start-up search adds every other world-writable folder it finds."""
# Filesystems of this machine's own whose folders are searched for world-writable ones; a
# network filesystem (NFS, CIFS, FUSE) is not walked (slow, and shared with other machines).
_LOCAL_FILESYSTEMS = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "bcachefs", "jfs", "reiserfs",
     "tmpfs", "ramfs", "devtmpfs", "overlay", "vfat"}
)  # fmt: skip
_SEARCH_LIMIT = 2_000_000
"""Folders looked at, at most, when searching for world-writable ones."""
_PROC = Path("/proc")
# Folders below a shared temp folder are cleared this deep; deeper, a folder of the uid's is
# taken back whole instead (a job can nest folders deeper than a walk should go).
_MAX_DEPTH = 32


class NoFreeUidError(GpulayerError):
    """Every uid of the range is held by a live attempt."""


@dataclass(frozen=True)
class UidRange:
    first: int
    last: int

    @classmethod
    def parse(cls, text: str) -> UidRange:
        """``FIRST-LAST``; ValueError with a one-line message naming the flag otherwise."""
        first_text, dash, last_text = text.strip().partition("-")
        try:
            first, last = int(first_text), int(last_text)
        except ValueError:
            first = last = -1
        if not dash or first < 0 or last < first:
            raise ValueError(
                f"{FLAG}: FIRST-LAST with FIRST <= LAST (such as 61000-61099), not {text!r}"
            )
        if first == 0:
            raise ValueError(f"{FLAG}: uid 0 is root; choose a range above the system's users")
        if last > 2**31 - 2:
            raise ValueError(f"{FLAG}: {last} is past the largest uid")
        return cls(first, last)

    def __len__(self) -> int:
        return self.last - self.first + 1

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.first <= uid <= self.last


def users_inside(uids: UidRange) -> list[str]:
    """Accounts of this machine whose uid lies in the range (none may)."""
    import pwd

    return sorted(
        f"{entry.pw_name} ({entry.pw_uid})" for entry in pwd.getpwall() if entry.pw_uid in uids
    )


class UidPool:
    """Which uids of the range live attempts hold. Thread-safe."""

    def __init__(self, uids: UidRange) -> None:
        self.uids = uids
        self._held: set[int] = set()
        self._lock = threading.Lock()
        self.shared_folders: tuple[Path, ...] = SHARED_TEMP_FOLDERS
        self.mqueues: Path | None = None

    def take(self) -> int:
        with self._lock:
            for uid in range(self.uids.first, self.uids.last + 1):
                if uid not in self._held:
                    self._held.add(uid)
                    return uid
        raise NoFreeUidError(
            f"{FLAG}: all {len(self.uids)} uids are held by running attempts; "
            "give the worker a larger range"
        )

    def release(self, uid: int, *, all_ended: bool = False) -> None:
        """Give the uid back once nothing of its attempt is left running or lying around (its
        attempt's folder already taken back, see take_back). ``all_ended``: the attempt's
        processes are known to be gone (its emptied cgroup), so /proc need not be searched."""
        if not all_ended:
            end_processes_of({uid})
        self._remove_leftovers({uid})
        with self._lock:
            self._held.discard(uid)

    def reclaim_all(self, work_root: Path) -> int:
        """At start, before any attempt: what an earlier life of the worker left to the range's
        uids (a kill -9 leaves attempt folders owned by them, and the next attempt gets the
        lowest uid again). Ends their processes, removes their temp files, takes back every
        attempt folder under work_root that one of them owns; how many processes it ended."""
        ended = end_processes_of(self.uids)
        # Taken back before the temp folders are cleared: a work dir may lie in one of them.
        for folder in attempt_folders(work_root):
            with contextlib.suppress(OSError):
                if folder.lstat().st_uid in self.uids:
                    take_back(folder)
        self.shared_folders = world_writable_folders(skip=work_root)
        self.mqueues = mqueue_folder()
        self._remove_leftovers(self.uids)
        return ended

    def _remove_leftovers(self, uids: Container[int]) -> None:
        """What the uids' processes made that outlives them: files where every user may
        write, SysV IPC objects, POSIX message queues, keys in their keyrings."""
        remove_temp_files_of(uids, self.shared_folders)
        remove_sysv_of(uids)
        remove_mqueues_of(uids, self.mqueues)
        clear_keyrings_of(uids)

    @property
    def held(self) -> int:
        with self._lock:
            return len(self._held)


def take_back(top: Path) -> None:
    """Give an ended attempt's folder (and all in it) back to the worker, closed to others."""
    if not top.is_dir() or top.is_symlink():
        return
    me_uid, me_gid = os.geteuid(), os.getegid()
    for root, dirs, files in os.walk(top):
        for name in [*dirs, *files]:
            with contextlib.suppress(OSError):
                os.chown(os.path.join(root, name), me_uid, me_gid, follow_symlinks=False)
    with contextlib.suppress(OSError):
        os.chown(top, me_uid, me_gid, follow_symlinks=False)
        top.chmod(0o700)


def remove_temp_files_of(
    uids: Container[int], folders: tuple[Path, ...] = SHARED_TEMP_FOLDERS
) -> None:
    for folder in folders:
        remove_files_of(uids, folder)


def _local_mounts() -> list[Path]:
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 3 and fields[2] in _LOCAL_FILESYSTEMS:
            # Spaces and the like in a mount point are octal escapes in this file.
            found.append(Path(fields[1].encode().decode("unicode_escape")))
    return found


def world_writable_folders(skip: Path | None = None) -> tuple[Path, ...]:
    """SHARED_TEMP_FOLDERS and every other folder of the machine's local filesystems that any
    user may write into (the only places, besides its attempt's folder, where a uid of the
    range can leave a file). Below one found, the clearing walk goes on its own; ``skip`` (the
    work dir) is the worker's to clear."""
    found: dict[tuple[int, int], Path] = {}
    for folder in SHARED_TEMP_FOLDERS:
        with contextlib.suppress(OSError):
            info = folder.stat()
            found[(info.st_dev, info.st_ino)] = folder
    skipped = skip.resolve() if skip is not None else None
    seen = 0
    for mount in _local_mounts():
        try:
            device = mount.stat().st_dev
        except OSError:
            continue
        pending = [mount]
        while pending and seen < _SEARCH_LIMIT:
            folder = pending.pop()
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for entry in entries:
                try:
                    if not entry.is_dir(follow_symlinks=False):
                        continue
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                seen += 1
                path = Path(entry.path)
                if info.st_dev != device or path == skipped:
                    continue  # another filesystem, walked from its own mount point
                if info.st_mode & (stat.S_IWOTH | stat.S_IXOTH) == stat.S_IWOTH | stat.S_IXOTH:
                    found.setdefault((info.st_dev, info.st_ino), path)
                else:
                    pending.append(path)
    if seen >= _SEARCH_LIMIT:
        log.warning(
            "searched %d folders for world-writable ones and stopped; jobs' files in any "
            "not found are not removed",
            seen,
        )
    return tuple(found.values())


def _process_uids(pid: str) -> tuple[set[int], str] | None:
    """The real, effective and saved uids of a process, and its state (None once it is gone)."""
    try:
        lines = (_PROC / pid / "status").read_text().splitlines()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    try:
        real, effective, saved = (int(u) for u in fields["Uid"].split()[:3])
        state = fields["State"].split()[0]
    except (KeyError, ValueError, IndexError):
        return None
    return {real, effective, saved}, state


def _running_as(uids: Container[int]) -> list[str]:
    me = os.getpid()
    found = []
    for entry in os.scandir(_PROC):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        seen = _process_uids(entry.name)
        if seen is not None and seen[1] not in ("Z", "X") and any(u in uids for u in seen[0]):
            found.append(entry.name)
    return found


def end_processes_of(uids: Container[int], timeout: float = 10.0) -> int:
    """SIGKILL every process whose real, effective or saved uid is one of the uids, until none
    is left (one may fork while others are ended); how many there were.

    Each is signalled through a pidfd, opened before its uids are read again: a pid that ended
    and was reused meanwhile is never signalled."""
    ended: set[str] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = _running_as(uids)
        if not pids:
            break
        for pid in pids:
            try:
                handle = os.pidfd_open(int(pid))
            except OSError:
                continue  # gone already
            try:
                seen = _process_uids(pid)
                if seen is not None and any(u in uids for u in seen[0]):
                    signal.pidfd_send_signal(handle, signal.SIGKILL)
                    ended.add(pid)
            except OSError:
                pass
            finally:
                os.close(handle)
        time.sleep(0.02)
    return len(ended)


_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_files_of(uids: Container[int], top: Path) -> None:
    """Remove what the uids own below ``top`` (a temp folder every user may write to).

    Every step goes through the folder's descriptor and never follows a link, so no path a
    job swapped meanwhile leads the walk out; a mount below ``top`` is left alone. Folders
    the uids cannot write to are passed over: nothing of theirs can be made inside."""
    try:
        fd = os.open(top, _FOLDER_FLAGS)
    except OSError:
        return
    try:
        _clear(fd, os.fstat(fd).st_dev, uids, 0)
    finally:
        os.close(fd)


def _writable(info: os.stat_result, uids: Container[int]) -> bool:
    """Whether a uid of the range could make entries in this folder (its gid is its uid, and
    it has no other group): only there can anything of its own lie. Others' folders that it
    may only search are passed over, which keeps the walk to a few folders of /tmp."""
    if info.st_uid in uids:
        return True
    searchable_writable = stat.S_IWGRP | stat.S_IXGRP
    if info.st_gid in uids and info.st_mode & searchable_writable == searchable_writable:
        return True
    searchable_writable = stat.S_IWOTH | stat.S_IXOTH
    return info.st_mode & searchable_writable == searchable_writable


def _clear(folder: int, device: int, uids: Container[int], depth: int) -> None:
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        try:
            info = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except OSError:
            continue
        owned = info.st_uid in uids
        if info.st_dev != device:
            continue  # another filesystem mounted here
        if not stat.S_ISDIR(info.st_mode):
            if owned:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=folder)
            continue
        if not _writable(info, uids):
            continue
        try:
            inner = os.open(name, _FOLDER_FLAGS, dir_fd=folder)
        except OSError:
            continue
        try:
            opened = os.fstat(inner)
            if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
                continue  # swapped for another folder since it was looked at
            if depth < _MAX_DEPTH:
                _clear(inner, device, uids, depth + 1)
            if owned:
                try:
                    os.rmdir(name, dir_fd=folder)
                except OSError:
                    # Not empty (too deep, or others' files in it): the worker keeps it,
                    # closed, so no later owner of the uid gets in.
                    with contextlib.suppress(OSError):
                        os.fchown(inner, os.geteuid(), os.getegid())
                        os.fchmod(inner, 0o700)
        finally:
            os.close(inner)
