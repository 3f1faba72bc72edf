"""A job's ``setup``: its commands, then its packages in a virtual environment kept per request.

The environment's key is the exact request (requirements as written, the requirements file's
bytes, the package indexes and the base interpreter), so a later job asking for the same gets
the same environment without installing anything, and any change gets a new one. uv builds it;
an environment is used only once its build finished (a marker written last), and two attempts
asking for one environment at once build it once (a lock per key).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpulayer.errors import GpulayerError
from gpulayer.protocol.messages import SETUP_LOG_PREFIX
from gpulayer.spec.models import Setup
from gpulayer.worker.containment import AttemptGroup
from gpulayer.worker.process import OutputPump, ProcessTree, Redactor, RunAs

SETUP_PREFIX = SETUP_LOG_PREFIX

_COMPLETE = ".gpulayer-complete"
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
    """``setup.find_links`` resolved in the job's source."""

    def key(self) -> str:
        """Names the environment: the same request on the same interpreter, the same key."""
        data = {
            "python": self.base_python,
            "version": _python_version(self.base_python),
            "pip": self.setup.pip,
            "requirements": self.requirements_text,
            "index_url": self.setup.index_url,
            "extra_index_urls": self.setup.extra_index_urls,
            "find_links": _folder_digests(self.find_links),
        }
        digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
        return digest[:24]


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


def _folder_digests(folders: Sequence[Path]) -> list[list[str]]:
    """What the wheel folders hold: other wheels there make another environment."""
    return [
        sorted(f"{w.name}:{w.stat().st_size}" for w in folder.glob("*.whl")) for folder in folders
    ]


def find_link_folders(setup: Setup, source: Path) -> tuple[Path, ...]:
    """``setup.find_links``, each a folder inside the job's source."""
    folders = []
    for name in setup.find_links:
        folder = (source / name).resolve()
        if not folder.is_relative_to(source.resolve()) or not folder.is_dir():
            raise SetupError(f"setup.find_links: {name!r} is not a folder of the job's source")
        folders.append(folder)
    return tuple(folders)


def read_requirements(setup: Setup, source: Path) -> str | None:
    """The requirements file's text, from the job's source folder."""
    if setup.requirements_file is None:
        return None
    path = source / setup.requirements_file
    try:
        resolved = path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise SetupError(
            f"setup.requirements_file: {setup.requirements_file!r} is not in the job's source"
        ) from None
    if not resolved.is_relative_to(source.resolve()) or not resolved.is_file():
        raise SetupError(
            f"setup.requirements_file: {setup.requirements_file!r} is not a file of the source"
        )
    return resolved.read_text(encoding="utf-8", errors="replace")


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
    _uv_cache: Path = Path()  # beside the environments: every job of the machine shares downloads

    def run(self, request: SetupRequest, cache_root: Path) -> str:
        """Run the commands, then make (or reuse) the environment; returns the interpreter
        the job runs with."""
        setup = request.setup
        self._uv_cache = cache_root / "uv-cache"
        deadline = time.monotonic() + setup.timeout_seconds
        started = time.monotonic()
        for command in setup.commands:
            # The job's own identity: a command of the job never runs with more rights than it.
            self._execute(command, deadline, setup, run_as=self.run_as, what=shlex.join(command))
        python = request.base_python
        if setup.installs_packages:
            python = self._environment(request, cache_root, deadline)
        self.log(f"{SETUP_PREFIX}done in {time.monotonic() - started:.1f} s")
        return python

    def _environment(self, request: SetupRequest, cache_root: Path, deadline: float) -> str:
        key = request.key()
        home = cache_root / key
        python = str(home / "bin" / "python")
        cache_root.mkdir(parents=True, exist_ok=True)
        with _locked(cache_root / f"{key}.lock"):
            if (home / _COMPLETE).is_file():
                self.log(f"{SETUP_PREFIX}reusing environment {key}")
                return python
            uv = uv_binary()
            if uv is None:
                raise SetupError("setup: uv is not installed on this worker (pip install uv)")
            shutil.rmtree(home, ignore_errors=True)  # a build cut short before
            self.log(f"{SETUP_PREFIX}creating environment {key}")
            setup = request.setup
            self._execute(
                [uv, "venv", "--quiet", "--python", request.base_python, str(home)],
                deadline,
                setup,
                what="creating the environment",
            )
            try:
                self._install(uv, request, home, deadline)
            except SetupError:
                shutil.rmtree(home, ignore_errors=True)
                raise
            _see_worker_packages(home)
            if self.run_as is not None:
                _readable_by_all(home)
            (home / _COMPLETE).write_text(json.dumps({"key": key, "at": time.time()}))
        return python

    def _install(self, uv: str, request: SetupRequest, home: Path, deadline: float) -> None:
        setup = request.setup
        argv = [uv, "pip", "install", "--python", str(home / "bin" / "python")]
        if setup.index_url:
            argv += ["--index-url", setup.index_url]
        for url in setup.extra_index_urls:
            argv += ["--extra-index-url", url]
        for folder in request.find_links:
            argv += ["--find-links", str(folder)]
        if request.find_links and not (setup.index_url or setup.extra_index_urls):
            argv.append("--no-index")  # wheels shipped with the job, for a machine with no index
        if self.run_as is not None:
            # The worker installs as itself: no package's build code of the job's runs so.
            argv.append("--no-build")
        requested = list(setup.pip)
        argv += requested
        if request.requirements_text is not None:
            requirements = home.parent / f"{home.name}.requirements.txt"
            requirements.write_text(request.requirements_text, encoding="utf-8")
            argv += ["--requirement", str(requirements)]
            requested.append(f"-r {setup.requirements_file}")
        self.log(f"{SETUP_PREFIX}installing {', '.join(requested)}")
        self._execute(argv, deadline, setup, what=f"installing {', '.join(requested)}")

    def _execute(
        self,
        argv: Sequence[str],
        deadline: float,
        setup: Setup,
        *,
        what: str,
        run_as: RunAs | None = None,
    ) -> None:
        lines: list[str] = []

        def sink(stream: str, text: str) -> None:
            line = text.rstrip("\n")
            lines.append(line)
            del lines[:-20]
            self.log(f"{SETUP_PREFIX}{line}")

        env = {**self.env, "UV_NO_PROGRESS": "1", "NO_COLOR": "1"}
        env.setdefault("UV_CACHE_DIR", str(self._uv_cache))
        try:
            tree = ProcessTree.spawn(argv, cwd=self.cwd, env=env, group=self.group, run_as=run_as)
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


def _readable_by_all(top: Path) -> None:
    for root, dirs, files in os.walk(top):
        for name in [*dirs, *files]:
            path = os.path.join(root, name)
            with contextlib.suppress(OSError):
                mode = os.lstat(path).st_mode
                if not os.path.islink(path):
                    os.chmod(path, mode | 0o044 | (0o011 if mode & 0o100 else 0))
    with contextlib.suppress(OSError):
        os.chmod(top, 0o755)
