"""A job's ``setup``: its commands, then its packages in a virtual environment kept per request.

The commands run as the job. The packages are installed by the worker (as root on a worker that
runs its jobs as other users), so what it reads for the job is a private copy of the job's
requirements file and wheel folders, read with the job's own rights (see :mod:`job_copy`), and
it reads no other path a job names: local packages travel as wheels in ``find_links`` folders.

The environment's key is the sha256 of every byte that can change what is installed: the
requirements as written, the requirements file's bytes, each shipped wheel's bytes, the index
settings, the base interpreter (its path, version and binary) and whether builds are allowed.
A later job asking for the same gets the same environment without installing anything, and
any change gets a new one. uv builds it; two attempts asking for one environment at once build
it once (a lock per key). A finished environment is made read-only, and the digest of each of
its files is recorded: before each reuse it is checked against that record, and rebuilt when
anything in it changed (a job of a worker that cannot isolate its jobs may write there).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import secrets
import shlex
import shutil
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpulayer.errors import GpulayerError
from gpulayer.protocol.messages import SETUP_LOG_PREFIX
from gpulayer.spec.models import Setup
from gpulayer.worker.containment import AttemptGroup
from gpulayer.worker.job_copy import JobCopyError, Wanted, copy_as_job
from gpulayer.worker.process import OutputPump, ProcessTree, Redactor, RunAs

SETUP_PREFIX = SETUP_LOG_PREFIX

_COMPLETE = ".gpulayer-complete"
_INCOMING = ".incoming"
_MANIFESTS = ".manifests"
# The record of each environment this process sealed: a record rewritten beside a changed
# environment (by a job of a worker that cannot isolate it) is caught while this worker runs.
_sealed_here: dict[str, str] = {}
_UV_DECORATION = " \u00d7\u2570\u2500\u25b6\u2502"  # the marks uv draws before its messages
_POLL_SECONDS = 0.1
_KILL_GRACE_SECONDS = 5.0


class SetupError(GpulayerError):
    """Setup did not finish: the message names what failed (a package, a command, the time)."""


class SetupCancelled(SetupError):
    """The attempt was cancelled while its setup ran."""


@dataclass(frozen=True)
class SetupRequest:
    setup: Setup
    base_python: str
    requirements_text: str | None = None
    find_links: tuple[Path, ...] = ()
    """``setup.find_links``, in the worker's private copy."""
    files: Mapping[str, str] = field(default_factory=dict)
    """The sha256 of each file copied for the request (requirements file, wheels)."""
    builds: bool = True
    """Whether packages may be built from source (not where the worker installs as root)."""

    def key(self) -> str:
        """Names the environment: the sha256 of everything that decides what it holds."""
        data = {
            "python": self.base_python,
            "version": _python_version(self.base_python),
            "interpreter": _file_sha256(self.base_python),
            "pip": self.setup.pip,
            "requirements": self.requirements_text,
            "index_url": self.setup.index_url,
            "extra_index_urls": self.setup.extra_index_urls,
            "find_links": self.setup.find_links,
            "files": dict(sorted(self.files.items())),
            "builds": self.builds,
        }
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


@functools.lru_cache(maxsize=16)
def _sha256_at(path: str, identity: tuple[int, int, int, int]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _file_sha256(path: str) -> str:
    """The sha256 of an interpreter's binary, hashed once while it stays the same file."""
    try:
        info = os.stat(path)
    except OSError:
        return "missing"
    return _sha256_at(path, (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns))


def _python_version(python: str) -> str:
    if python == base_interpreter():
        return sys.version
    return python  # another interpreter: its path is the best cheap name for it


def base_interpreter() -> str:
    """The interpreter under the worker's own virtual environment: it outlives the worker's
    install dir, so an environment built on it serves the next worker on the machine too."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


WORKER_SITE_VARIABLE = "GPULAYER_WORKER_SITE"
"""The worker's package folders, which a setup environment reads after its own."""


def worker_site_dirs() -> str:
    import sysconfig

    paths = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    return os.pathsep.join(paths)


_REMOTE_SCHEMES = ("http://", "https://")
# Requirement-file options that name another file or folder of the machine.
_PATH_OPTIONS = ("-r", "--requirement", "-c", "--constraint", "-e", "--editable", "-f",
                 "--find-links")  # fmt: skip
_INDEX_OPTIONS = ("-i", "--index-url", "--extra-index-url")


def refuse_machine_references(setup: Setup, requirements_text: str | None) -> None:
    """Refuse what would have the installer open a path of the worker's machine for the job:
    a file:// index, a package named by a path or file:// URL, a requirements file's options
    that name other files. Local packages travel as wheels in ``find_links`` folders."""
    for name, url in [("setup.index_url", setup.index_url)] + [
        (f"setup.extra_index_urls[{i}]", u) for i, u in enumerate(setup.extra_index_urls)
    ]:
        if url is not None and not url.lower().startswith(_REMOTE_SCHEMES):
            raise SetupError(f"{name}: {url!r} is a path of the worker's machine; use http(s)")
    for index, line in enumerate(setup.pip):
        why = _machine_reference(line)
        if why:
            raise SetupError(f"setup.pip[{index}]: {line!r} {why}")
    for number, raw in enumerate((requirements_text or "").splitlines(), start=1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        option = line.split("=", 1)[0].split()[0]
        if option in _PATH_OPTIONS:
            raise SetupError(
                f"setup.requirements_file: line {number}: {option} names a file of the "
                "worker's machine; ship wheels in setup.find_links instead"
            )
        if option in _INDEX_OPTIONS:
            url = line[len(option) :].lstrip(" =")
            if not url.lower().startswith(_REMOTE_SCHEMES):
                raise SetupError(
                    f"setup.requirements_file: line {number}: {url!r} is a path of the "
                    "worker's machine; use http(s)"
                )
            continue
        if line.startswith("-"):
            continue  # other options (--hash on its own line, --pre, ...) name no path
        why = _machine_reference(line.split(" --", 1)[0].strip())
        if why:
            raise SetupError(f"setup.requirements_file: line {number}: {line!r} {why}")


def _machine_reference(requirement: str) -> str | None:
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        parsed = Requirement(requirement)
    except InvalidRequirement:
        return "is not a package requirement (a path or URL): ship wheels in setup.find_links"
    if parsed.url is not None and not parsed.url.lower().startswith(_REMOTE_SCHEMES):
        return "names a file of the worker's machine: ship wheels in setup.find_links"
    return None


def uv_binary() -> str | None:
    """uv, from the worker's own environment (a dependency of gpulayer) or the PATH."""
    try:
        from uv import find_uv_bin

        found = str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        return shutil.which("uv")
    if not os.access(found, os.X_OK):
        # pip installs a wheel's binary scripts without their exec bit under umask 077 (as
        # the bootstrap runs); the worker owns its environment, so it may mend that.
        with contextlib.suppress(OSError):
            os.chmod(found, os.stat(found).st_mode | 0o100)
    return found


@dataclass
class SetupRunner:
    """Runs one attempt's setup; every process it starts stays in the attempt's group."""

    cwd: Path
    env: Mapping[str, str]
    log: Callable[[str], None]
    cancelled: threading.Event
    redactor: Redactor
    group: AttemptGroup | None = None
    run_as: RunAs | None = None
    helper_env: Mapping[str, str] | None = None
    """The environment the installer runs in: the worker's, never the job's (a job's
    UV_*/PIP_* settings or config files must not steer a process with the worker's rights)."""
    machine_paths: bool = False
    """Whether the job may name paths of this machine (the local control plane's own worker,
    which runs as the submitting user); otherwise every such reference is refused."""
    _uv_cache: Path = Path()  # beside the environments: every job of the machine shares downloads

    def run(self, setup: Setup, cache_root: Path) -> str:
        """Run the commands, then make (or reuse) the environment; returns the interpreter
        the job runs with."""
        self._uv_cache = cache_root / "uv-cache"
        deadline = time.monotonic() + setup.timeout_seconds
        started = time.monotonic()
        for command in setup.commands:
            # The job's own identity: a command of the job never runs with more rights than it.
            self._execute(command, deadline, setup, run_as=self.run_as, what=shlex.join(command))
        python = base_interpreter()
        if setup.installs_packages:
            python = self._prepared_environment(setup, cache_root, deadline)
        self.log(f"{SETUP_PREFIX}done in {time.monotonic() - started:.1f} s")
        return python

    def _prepared_environment(self, setup: Setup, cache_root: Path, deadline: float) -> str:
        """The job's files the install needs, copied as the job, then the environment."""
        # Jobs reach their environment by its name (a digest of what it holds) but list
        # nothing: neither other jobs' environments nor what uv downloaded for them.
        _private_folder(cache_root, 0o711 if self.run_as is not None else 0o700)
        _private_folder(self._uv_cache, 0o700)
        incoming = _private_folder(cache_root / _INCOMING, 0o700)
        private = incoming / secrets.token_hex(8)
        try:
            request = self._request(setup, private)
            return self._environment(request, cache_root, deadline, private)
        finally:
            if private.exists():
                shutil.rmtree(private, ignore_errors=True)

    def _request(self, setup: Setup, private: Path) -> SetupRequest:
        wanted = [Wanted("setup.find_links", name) for name in setup.find_links]
        if setup.requirements_file is not None:
            wanted.append(Wanted("setup.requirements_file", setup.requirements_file))
        try:
            files = copy_as_job(self.cwd, wanted, private, run_as=self.run_as)
        except JobCopyError as exc:
            raise SetupError(str(exc)) from None
        requirements = None
        if setup.requirements_file is not None:
            path = private / setup.requirements_file
            if not path.is_file() or path.is_symlink():
                raise SetupError(
                    f"setup.requirements_file: {setup.requirements_file!r} is not a file"
                )
            requirements = path.read_text(encoding="utf-8", errors="replace")
        folders = []
        for name in setup.find_links:
            folder = private / name
            if not folder.is_dir():
                raise SetupError(f"setup.find_links: {name!r} is not a folder of the job's source")
            folders.append(folder)
        if not self.machine_paths:
            refuse_machine_references(setup, requirements)
        return SetupRequest(
            setup,
            base_interpreter(),
            requirements,
            tuple(folders),
            {k: v for k, v in files.items() if k.endswith(".whl") or k == setup.requirements_file},
            builds=self.run_as is None,
        )

    def _environment(
        self, request: SetupRequest, cache_root: Path, deadline: float, private: Path
    ) -> str:
        key = request.key()
        label = key[:24]
        home = cache_root / key
        python = str(home / "bin" / "python")
        with _locked(cache_root / f"{key}.lock"):
            if home.exists() or home.is_symlink():
                problem = _unchanged(home, cache_root)
                if problem is None:
                    self.log(f"{SETUP_PREFIX}reusing environment {label}")
                    return python
                if (home / _COMPLETE).is_file():
                    self.log(f"{SETUP_PREFIX}environment {label} changed since it was built "
                             f"({problem}); building it again")  # fmt: skip
            uv = uv_binary()
            if uv is None:
                raise SetupError("setup: uv is not installed on this worker (pip install uv)")
            _remove_tree(home)  # a build cut short, or one that changed
            self.log(f"{SETUP_PREFIX}creating environment {label}")
            setup = request.setup
            self._execute(
                [uv, "venv", "--quiet", "--python", request.base_python, str(home)],
                deadline,
                setup,
                what="creating the environment",
                helper=private,
            )
            try:
                self._install(uv, request, home, deadline, private)
            except SetupError:
                _remove_tree(home)
                raise
            _see_worker_packages(home)
            (home / _COMPLETE).write_text(json.dumps({"key": key, "at": time.time()}))
            _seal(home, cache_root, readable_by_all=self.run_as is not None)
        return python

    def _install(
        self, uv: str, request: SetupRequest, home: Path, deadline: float, private: Path
    ) -> None:
        setup = request.setup
        # Bytecode made now, and checked with the rest: a job would otherwise write it on its
        # first import (where it may: as the worker's user), changing a sealed environment.
        argv = [
            uv,
            "pip",
            "install",
            "--compile-bytecode",
            # Files copied, not hard-linked from uv's cache: a write into one environment must
            # not reach the cache that every later build installs from.
            "--link-mode",
            "copy",
            "--python",
            str(home / "bin" / "python"),
        ]
        if setup.index_url:
            argv += ["--index-url", setup.index_url]
        for url in setup.extra_index_urls:
            argv += ["--extra-index-url", url]
        for folder in request.find_links:
            argv += ["--find-links", str(folder)]
        if request.find_links and not (setup.index_url or setup.extra_index_urls):
            argv.append("--no-index")  # wheels shipped with the job, for a machine with no index
        if not request.builds:
            # The worker installs as itself: no package's build code of the job's runs so.
            argv.append("--no-build")
        requested = list(setup.pip)
        argv += requested
        if request.requirements_text is not None:
            requirements = private / ".requirements.txt"
            requirements.write_text(request.requirements_text, encoding="utf-8")
            argv += ["--requirement", str(requirements)]
            requested.append(f"-r {setup.requirements_file}")
        self.log(f"{SETUP_PREFIX}installing {', '.join(requested)}")
        self._execute(
            argv, deadline, setup, what=f"installing {', '.join(requested)}", helper=private
        )

    def _execute(
        self,
        argv: Sequence[str],
        deadline: float,
        setup: Setup,
        *,
        what: str,
        run_as: RunAs | None = None,
        helper: Path | None = None,
    ) -> None:
        """Run a step of the setup: a command of the job's (as the job, in its folder), or,
        with ``helper`` (a private folder of the worker's), the installer acting for it, in
        that folder with the worker's environment and no configuration file read."""
        lines: list[str] = []

        def sink(stream: str, text: str) -> None:
            line = text.rstrip("\n")
            lines.append(line)
            del lines[:-20]
            self.log(f"{SETUP_PREFIX}{line}")

        if helper is None:
            env = {**self.env, "UV_NO_PROGRESS": "1", "NO_COLOR": "1"}
            env.setdefault("UV_CACHE_DIR", str(self._uv_cache))
            cwd = self.cwd
        else:
            base = os.environ if self.helper_env is None else self.helper_env
            env = {k: v for k, v in base.items() if not k.startswith(("UV_", "VIRTUAL_ENV"))}
            env.update(UV_NO_PROGRESS="1", NO_COLOR="1", UV_NO_CONFIG="1")
            env["UV_CACHE_DIR"] = str(self._uv_cache)
            cwd = helper
        try:
            tree = ProcessTree.spawn(argv, cwd=cwd, env=env, group=self.group, run_as=run_as)
        except OSError as exc:
            raise SetupError(f"setup: cannot start {argv[0]!r}: {exc.strerror or exc}") from None
        assert tree.popen.stdout is not None and tree.popen.stderr is not None
        pump = OutputPump(
            {"stdout": tree.popen.stdout.fileno(), "stderr": tree.popen.stderr.fileno()},
            sink,
            redactor=self.redactor,
        )
        pump.start()
        ending = "exited"
        while tree.exited() is None:
            if self.cancelled.wait(_POLL_SECONDS):
                ending = "cancelled"
                break
            if time.monotonic() >= deadline:
                ending = "timeout"
                break
        tree.terminate(_KILL_GRACE_SECONDS)
        pump.finish(timeout=_KILL_GRACE_SECONDS)
        code = tree.close()
        if ending == "cancelled":
            raise SetupCancelled("cancelled during setup")
        if ending == "timeout":
            raise SetupError(f"setup timed out after {setup.timeout_seconds:g} s while {what}")
        if code != 0:
            raise SetupError(f"setup: {what} failed (exit {code}): {_cause(lines)}")


def _cause(lines: list[str]) -> str:
    """The line of a failed install that says why (uv names the package there)."""
    meaningful = [line.strip(_UV_DECORATION) for line in lines if line.strip()]
    for line in meaningful:
        if "Because" in line or "not found" in line or "No solution" in line:
            return line.strip()
    for line in reversed(meaningful):
        if "error" in line.lower():
            return line.strip()
    return meaningful[-1].strip() if meaningful else "no output"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _see_worker_packages(home: Path) -> None:
    """After its own packages, the environment sees those of the worker that runs the job
    (gpulayer's function shim and train context among them), named by the job's environment
    since the environment outlives any one worker: the job's versions win."""
    found = sorted(home.glob("lib/python*/site-packages"))
    if not found:
        return
    # addsitedir, not a path line: the worker's own .pth files (editable installs) count too.
    line = (  # one line, names bound at its top level (a .pth line runs in exec's scope)
        "import os, site; list(map(site.addsitedir, filter(None, "
        f"os.environ.get({WORKER_SITE_VARIABLE!r}, '').split(os.pathsep))))\n"
    )
    (found[0] / "_gpulayer_worker.pth").write_text(line)


def _private_folder(path: Path, mode: int) -> Path:
    """A folder of the worker's with ``mode``, refused if it is anything else (a link a job
    put there, another user's folder)."""
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise SetupError(f"setup: {path} is not a folder of the worker's own; remove it")
    if stat.S_IMODE(info.st_mode) != mode:
        path.chmod(mode)
    return path


def _manifest_of(
    home: Path, known: Mapping[str, list[object]] | None = None
) -> dict[str, list[object]]:
    """Each entry under ``home``: a folder and its mode, a file with its mode, sha256 and
    identity (inode, size, change time), or a link and its target; read without following
    any link. A file whose identity matches its entry in ``known`` keeps that entry's digest
    without being read again: its change time is set by the kernel on every write, chmod or
    rename, and only root can set it back."""
    entries: dict[str, list[object]] = {}
    top = str(home)
    for root, dirs, files in os.walk(top):
        inside = root[len(top) + 1 :]  # relpath's own work, without its cost per entry
        for name in sorted([*dirs, *files]):
            path = f"{root}/{name}"
            relative = f"{inside}/{name}" if inside else name
            info = os.lstat(path)
            mode = stat.S_IMODE(info.st_mode)
            if stat.S_ISLNK(info.st_mode):
                entries[relative] = ["link", os.readlink(path)]
            elif stat.S_ISDIR(info.st_mode):
                entries[relative] = ["dir", mode]
            elif stat.S_ISREG(info.st_mode):
                identity = [info.st_ino, info.st_size, info.st_ctime_ns]
                before = (known or {}).get(relative)
                if before is not None and before[:2] == ["file", mode] and before[3:] == identity:
                    entries[relative] = list(before)
                    continue
                digest = hashlib.sha256()
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
                with os.fdopen(fd, "rb") as stream:
                    for chunk in iter(functools.partial(stream.read, 1 << 20), b""):
                        digest.update(chunk)
                entries[relative] = ["file", mode, digest.hexdigest(), *identity]
            else:
                entries[relative] = ["other", mode]
    return entries


def _digests(entries: Mapping[str, list[object]]) -> dict[str, list[object]]:
    """The entries less the files' identities: what the environment holds."""
    return {name: entry[:3] if entry[0] == "file" else entry for name, entry in entries.items()}


def _manifest_path(home: Path, cache_root: Path) -> Path:
    return cache_root / _MANIFESTS / f"{home.name}.json"


def _seal(home: Path, cache_root: Path, *, readable_by_all: bool) -> None:
    """Make a finished environment read-only (readable by every job's user where jobs run as
    others), then record the digest of each of its files."""
    for root, dirs, files in os.walk(home, topdown=False):
        for name in [*files, *dirs]:
            path = os.path.join(root, name)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                continue
            mode = stat.S_IMODE(info.st_mode) & ~0o222
            if readable_by_all:
                mode |= 0o444 | (0o111 if info.st_mode & 0o100 else 0)
            os.chmod(path, mode)
    os.chmod(home, 0o555 if readable_by_all else 0o500)
    record = json.dumps(_manifest_of(home), sort_keys=True).encode()
    manifests = _private_folder(cache_root / _MANIFESTS, 0o700)
    partial = manifests / f".{home.name}.{secrets.token_hex(4)}"
    partial.write_bytes(record)
    os.replace(partial, _manifest_path(home, cache_root))
    _sealed_here[str(home)] = hashlib.sha256(record).hexdigest()


def _unchanged(home: Path, cache_root: Path) -> str | None:
    """None when ``home`` is exactly as it was sealed; else what differs."""
    try:
        record = _manifest_path(home, cache_root).read_bytes()
    except OSError:
        return "no record of its files"
    known = _sealed_here.get(str(home))
    if known is not None and hashlib.sha256(record).hexdigest() != known:
        return "its record was rewritten"
    try:
        recorded = json.loads(record)
        found = _digests(json.loads(json.dumps(_manifest_of(home, recorded))))
        expected = _digests(recorded)
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        return f"cannot be read: {exc}"
    if found == expected:
        return None
    changed = sorted(set(found) ^ set(expected)) or sorted(
        name for name in found if found[name] != expected.get(name)
    )
    return f"{changed[0]}" + (f" and {len(changed) - 1} more" if len(changed) > 1 else "")


def _remove_tree(top: Path) -> None:
    """Remove an environment, sealed (read-only) or not."""
    if not top.exists() and not top.is_symlink():
        return
    if top.is_symlink() or not top.is_dir():
        top.unlink()
        return
    for root, dirs, _ in os.walk(top):
        for name in dirs:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                with contextlib.suppress(OSError):
                    os.chmod(path, 0o700)
    with contextlib.suppress(OSError):
        os.chmod(top, 0o700)
    shutil.rmtree(top, ignore_errors=True)
