"""The host's side of a bootstrap: probing its python, and the worker's install, made once per
machine and version. Runs on the host with its own python (stdlib only, python >= 3.10): the
bootstrap sends this file's source as ``python3 -c SOURCE COMMAND ARGS...``; gpulayer never
imports it.

    probe   INSTALL_DIR WHEELHOUSE MIN_VERSION [WORKER_ROOT WHEELSET VERSION]
    install WORKER_ROOT WHEELSET VERSION WHEELHOUSE SYSTEM_SITE

A worker install is content-addressed: its directory under WORKER_ROOT is named by the sha256
of what goes into it (the controller's wheel set digest, which covers the gpulayer version,
every wheel's digest and the venv's options, and this host's interpreter), so two jobs that
would install the same thing share one install, and anything that changes makes a new one. It
is built in a staging directory and renamed into place under a lock, sealed with a manifest
of every file's digest, and made read-only. Before each reuse the probe checks the seal, the
manifest (a changed, added or missing file fails it) and that the venv's python imports
gpulayer at the expected version; an install that fails is rebuilt.

Every line meant for the controller starts with ``gpulayer-bootstrap:``; the probe prints one
JSON line. Silent waits (another bootstrap's install, pip) print what they wait for every few
seconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import sysconfig
import time
from typing import Any

FORMAT = 1
SEAL = "seal.json"
PREFIX = "gpulayer-bootstrap:"
PROGRESS_SECONDS = 4.0
KEEP_INSTALLS = 2
_STAGING = ".build-"


def say(text: str) -> None:
    sys.stdout.write(f"{PREFIX} {text}\n")
    sys.stdout.flush()


# --- what this host is --------------------------------------------------------------------------


def interpreter() -> dict[str, Any]:
    impl = getattr(sys, "implementation", None)
    libc = platform.libc_ver()
    return {
        "version": ".".join(str(n) for n in sys.version_info[:3]),
        "executable": sys.executable,
        "implementation": impl.name if impl else platform.python_implementation().lower(),
        "platform": sysconfig.get_platform().replace("-", "_").replace(".", "_"),
        "glibc": libc[1] if libc[0] == "glibc" else None,
    }


def worker_key(wheelset: str) -> str:
    """The install's identity: the controller's wheel set and this interpreter (a python
    upgraded in place makes a new install, as its venv would break)."""
    facts = interpreter()
    identity = {
        "format": FORMAT,
        "wheelset": wheelset,
        "implementation": facts["implementation"],
        "version": facts["version"],
        "platform": facts["platform"],
        "executable": os.path.realpath(sys.executable),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def worker_dir(root: str, version: str, key: str) -> str:
    return os.path.join(root, f"gpulayer-{version}-{key[:24]}")


# --- the seal -----------------------------------------------------------------------------------


def _file_digest(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _stamp(info: os.stat_result) -> list[int]:
    """What the kernel changes whenever a file's bytes, mode or links change (the change time
    cannot be set from user space): a file with the stamp it was sealed with is not read."""
    return [info.st_ino, info.st_size, info.st_ctime_ns]


def manifest(
    directory: str, trusted: dict[str, tuple[list[int], list[Any]]] | None = None
) -> dict[str, list[Any]]:
    """Every entry below ``directory`` but the seal: folders, links with their target, files
    with size, digest and whether they execute. A file whose stamp is the one ``trusted``
    holds for it keeps the entry given there, unread."""
    trusted = trusted or {}
    entries: dict[str, list[Any]] = {}
    for top, folders, files in os.walk(directory):
        folders.sort()
        for name in folders + sorted(files):
            path = os.path.join(top, name)
            relative = os.path.relpath(path, directory)
            if relative == SEAL:
                continue
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                entries[relative] = ["link", os.readlink(path)]
            elif stat.S_ISDIR(info.st_mode):
                entries[relative] = ["dir"]
            elif stat.S_ISREG(info.st_mode):
                known = trusted.get(relative)
                if known is not None and known[0] == _stamp(info):
                    entries[relative] = list(known[1])
                    continue
                executable = bool(info.st_mode & stat.S_IXUSR)
                entries[relative] = ["file", info.st_size, _file_digest(path), executable]
            else:
                entries[relative] = ["other"]
    return entries


def stamps(directory: str) -> dict[str, list[int]]:
    found = {}
    for top, _folders, files in os.walk(directory):
        for name in files:
            path = os.path.join(top, name)
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode):
                found[os.path.relpath(path, directory)] = _stamp(info)
    found.pop(SEAL, None)
    return found


def _difference(expected: dict[str, Any], found: dict[str, list[Any]]) -> str | None:
    for path in sorted(set(expected) | set(found)):
        if path not in found:
            return f"{path} is missing"
        if path not in expected:
            return f"{path} was added"
        if list(expected[path]) != found[path]:
            return f"{path} changed"
    return None


def python_check(directory: str, version: str) -> str | None:
    """Why the install's python does not import gpulayer at ``version``, or None."""
    python = os.path.join(directory, "venv", "bin", "python")
    code = "import gpulayer, importlib.metadata as m; print(m.version('gpulayer'))"
    try:
        done = subprocess.run(
            [python, "-I", "-c", code], capture_output=True, text=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"its python does not run ({exc})"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"its python does not import gpulayer ({last})"
    if done.stdout.strip() != version:
        return f"its python imports gpulayer {done.stdout.strip()}, not {version}"
    return None


def verify(directory: str, key: str, version: str) -> str | None:
    """Why the install at ``directory`` cannot be reused, or None when it can."""
    try:
        with open(os.path.join(directory, SEAL)) as handle:
            seal = json.load(handle)
    except FileNotFoundError:
        return "not installed"
    except (OSError, ValueError) as exc:
        return f"its seal is unreadable ({exc})"
    if not isinstance(seal, dict) or seal.get("format") != FORMAT or seal.get("key") != key:
        return "its seal names another install"
    expected = seal.get("files")
    if not isinstance(expected, dict):
        return "its seal lists no files"
    sealed_stamps = seal.get("stamps")
    if not isinstance(sealed_stamps, dict):
        sealed_stamps = {}
    trusted = {p: (list(v), expected[p]) for p, v in sealed_stamps.items() if p in expected}
    try:
        changed = _difference(expected, manifest(directory, trusted))
    except OSError as exc:
        return f"it cannot be read ({exc})"
    if changed is not None:
        return changed
    return python_check(directory, version)


# --- probe --------------------------------------------------------------------------------------


def _wheels(wheelhouse: str) -> dict[str, list[Any]]:
    if not os.path.isdir(wheelhouse):
        os.makedirs(wheelhouse, 0o755)
    found: dict[str, list[Any]] = {}
    for name in sorted(os.listdir(wheelhouse)):
        path = os.path.join(wheelhouse, name)
        if name.endswith(".whl") and os.path.isfile(path):
            found[name] = [os.path.getsize(path), _file_digest(path)]
    return found


def _worker_state(root: str, wheelset: str, version: str) -> dict[str, Any]:
    key = worker_key(wheelset)
    directory = worker_dir(root, version, key)
    why = verify(directory, key, version)
    if why is None:
        # Marks it used: pruning keeps the installs used last.
        with contextlib.suppress(OSError):
            os.utime(directory)
    return {"key": key, "dir": directory, "valid": why is None, "why": why}


def probe(argv: list[str]) -> int:
    install_dir, wheelhouse, minimum = argv[0], argv[1], argv[2]
    want = tuple(int(part) for part in minimum.split("."))
    out: dict[str, Any] = interpreter()
    try:
        import venv  # noqa: F401

        out["venv"] = True
    except ImportError:
        out["venv"] = False
    home = os.path.realpath(os.path.expanduser("~"))
    out["wheels"] = {}
    if (home + "/").startswith(os.path.realpath(install_dir) + "/"):
        out["refused"] = "install_dir holds the home directory " + home
    elif tuple(sys.version_info[:2]) >= want and out["venv"]:
        if not os.path.isdir(install_dir):
            os.makedirs(install_dir, 0o700)
        os.chmod(install_dir, 0o700)
        if len(argv) >= 6:
            out["worker"] = _worker_state(argv[3], argv[4], argv[5])
        # The wheels are only needed when the worker is to be installed.
        if not out.get("worker", {}).get("valid"):
            out["wheels"] = _wheels(wheelhouse)
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


# --- install ------------------------------------------------------------------------------------


def _writable_then_remove(path: str) -> None:
    """Remove an install, read-only as it is."""
    if not os.path.lexists(path):
        return
    for top, folders, _files in os.walk(path):
        for name in folders:
            with contextlib.suppress(OSError, NotImplementedError):
                os.chmod(os.path.join(top, name), 0o700, follow_symlinks=False)
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)
    shutil.rmtree(path, ignore_errors=True)


def _read_only(path: str) -> None:
    """Jobs may read and run the install, never change it."""
    for top, folders, files in os.walk(path):
        for name in files:
            full = os.path.join(top, name)
            if not os.path.islink(full):
                mode = os.lstat(full).st_mode
                os.chmod(full, 0o555 if mode & stat.S_IXUSR else 0o444)
        for name in folders:
            full = os.path.join(top, name)
            if not os.path.islink(full):
                os.chmod(full, 0o555)
    os.chmod(path, 0o555)


def _lock(root: str, name: str) -> Any:
    """An exclusive lock on this install's name, saying every few seconds that it waits for
    another bootstrap installing the same worker."""
    import fcntl

    handle = open(os.path.join(root, f".{name}.lock"), "a")  # noqa: SIM115 (held till exit)
    begun = time.monotonic()
    told = begun
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            pass
        now = time.monotonic()
        if now - told >= PROGRESS_SECONDS:
            say(f"waiting for another bootstrap installing {name} ({now - begun:.0f} s)")
            told = now
        time.sleep(0.1)


def _run_pip(staging: str, wheelhouse: str) -> None:
    names = sorted(n for n in os.listdir(wheelhouse) if n.endswith(".whl"))
    runner = next((n for n in names if n.startswith("pip-")), None)
    if runner is None:
        raise RuntimeError(f"the wheelhouse {wheelhouse} has no pip to install with")
    wheels = [os.path.join(wheelhouse, n) for n in names if n != runner]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    os.makedirs(os.path.join(staging, "tmp"), 0o700)
    env.update(
        TMPDIR=os.path.join(staging, "tmp"),
        PIP_CONFIG_FILE=os.devnull,
        PIP_NO_CACHE_DIR="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PYTHONNOUSERSITE="1",
    )
    python = os.path.join(staging, "venv", "bin", "python")
    argv = [python, os.path.join(wheelhouse, runner, "pip"), "install", "--quiet", "--no-index"]
    argv += ["--find-links", wheelhouse, "--no-deps", "--no-warn-script-location", "--no-compile"]
    say(f"installing {len(wheels)} wheels from {wheelhouse} (no package index)")
    code, output = _run_saying([*argv, *wheels], env, f"installing {len(wheels)} wheels")
    if code != 0:
        for line in output.splitlines()[-15:]:
            say(f"pip: {line}")
        raise RuntimeError("installing from the wheelhouse failed")
    _compile_missing(os.path.join(staging, "venv", "lib"))
    shutil.rmtree(os.path.join(staging, "tmp"), ignore_errors=True)


def _compile_missing(lib: str) -> None:
    """The wheelhouse carries each module's bytecode; a module without (a wheelhouse of an
    older format) is compiled here, so no python ever writes bytecode into the sealed install
    (root could, read-only as it is, and break the seal)."""
    import importlib.util
    import py_compile

    mode = py_compile.PycInvalidationMode.UNCHECKED_HASH
    for top, _folders, files in os.walk(lib):
        for name in files:
            if not name.endswith(".py"):
                continue
            source = os.path.join(top, name)
            if not os.path.exists(importlib.util.cache_from_source(source)):
                py_compile.compile(source, doraise=False, quiet=2, invalidation_mode=mode)


def _run_saying(argv: list[str], env: dict[str, str], doing: str) -> tuple[int, str]:
    """Run ``argv``, saying what it does every few seconds while it runs."""
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    begun = time.monotonic()
    while True:
        try:
            output, _ = process.communicate(timeout=PROGRESS_SECONDS)
            return process.returncode, output.decode(errors="replace")
        except subprocess.TimeoutExpired:
            say(f"{doing} ({time.monotonic() - begun:.0f} s)")


def _relocate(staging: str, final: str) -> None:
    """The venv was made at its staging path: its scripts and config name it; name the final
    path instead (bytecode needs nothing: python fixes a module's path when it loads it)."""
    old, new = staging.encode(), final.encode()
    bin_dir = os.path.join(staging, "venv", "bin")
    paths = [os.path.join(bin_dir, name) for name in os.listdir(bin_dir)]
    paths.append(os.path.join(staging, "venv", "pyvenv.cfg"))
    for path in paths:
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as handle:
            data = handle.read()
        if old in data:
            with open(path, "wb") as handle:
                handle.write(data.replace(old, new))


def _build(python_args: list[str], staging: str, final: str, wheelhouse: str) -> None:
    say(f"creating venv {final}/venv")
    venv = os.path.join(staging, "venv")
    done = subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", *python_args, venv],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"cannot create a venv: {done.stderr.strip()}")
    _run_pip(staging, wheelhouse)
    _relocate(staging, final)


def _in_use(root: str) -> set[str]:
    """Installs a job dir beside the worker root links to: a worker may run from them."""
    used = set()
    parent = os.path.dirname(root)
    for name in os.listdir(parent):
        link = os.path.join(parent, name, "venv")
        if os.path.islink(link):
            used.add(os.path.dirname(os.path.realpath(link)))
    return used


def _prune(root: str, keep: str) -> None:
    """Each version leaves an install; only the ones used last stay, and none in use goes."""
    try:
        used = _in_use(root) | {keep}
        installs = [
            os.path.join(root, n)
            for n in os.listdir(root)
            if n.startswith("gpulayer-") and os.path.isdir(os.path.join(root, n))
        ]
    except OSError:
        return
    installs.sort(key=lambda p: os.stat(p).st_mtime, reverse=True)
    others = [p for p in installs if p != keep]
    for old in others[KEEP_INSTALLS - 1 :]:
        if os.path.realpath(old) not in used:
            say(f"removing an older worker install {old}")
            _writable_then_remove(old)


def _seal(staging: str, key: str, version: str) -> None:
    """Record every file's digest, make the install read-only, then record the stamps the
    files have from then on."""
    files = manifest(staging)
    _read_only(staging)
    seal = {"format": FORMAT, "key": key, "version": version, "files": files}
    seal["stamps"] = stamps(staging)
    os.chmod(staging, 0o755)
    path = os.path.join(staging, SEAL)
    with open(path, "w") as handle:
        json.dump(seal, handle, sort_keys=True)
    os.chmod(path, 0o444)
    os.chmod(staging, 0o555)


def install(argv: list[str]) -> int:
    root, wheelset, version, wheelhouse, system_site = argv[:5]
    key = worker_key(wheelset)
    final = worker_dir(root, version, key)
    name = os.path.basename(final)
    os.makedirs(root, 0o755, exist_ok=True)
    lock = _lock(root, name)
    try:
        why = verify(final, key, version)
        if why is None:
            say(f"reusing the worker install {final} (installed by another bootstrap)")
            say(f"worker-venv={final}/venv")
            return 0
        say(f"installing the worker into {final}: {why}")
        for old in os.listdir(root):  # builds a killed bootstrap left (the lock is ours)
            if old.startswith(f".{name}{_STAGING}"):
                _writable_then_remove(os.path.join(root, old))
        staging = os.path.join(root, f".{name}{_STAGING}{os.getpid()}")
        os.makedirs(staging, 0o755)
        try:
            options = ["--system-site-packages"] if system_site == "1" else []
            _build(options, staging, final, wheelhouse)
            problem = python_check(staging, version)
            if problem is not None:
                raise RuntimeError(f"the new install fails its check: {problem}")
            _seal(staging, key, version)
            _writable_then_remove(final)
            os.rename(staging, final)
        except BaseException:
            _writable_then_remove(staging)
            raise
        say(f"worker installed in {final}")
        _prune(root, final)
        say(f"worker-venv={final}/venv")
        return 0
    finally:
        lock.close()


def main(argv: list[str]) -> int:
    commands = {"probe": probe, "install": install}
    if not argv or argv[0] not in commands:
        sys.stderr.write(f"{PREFIX} error: expected probe or install, not {argv[:1]}\n")
        return 2
    try:
        return commands[argv[0]](argv[1:])
    except RuntimeError as exc:
        sys.stderr.write(f"{PREFIX} error: {exc}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
