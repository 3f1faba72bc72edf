"""The worker's install on a host, made once per machine and version: what identifies it and
the host commands that find, verify and build it. Pure; the host's side is
:mod:`gpulayer.cloud.bootstrap.host_worker`, sent as source (the host has no gpulayer yet).

The install lives in ``<worker_root>/gpulayer-<version>-<digest>`` (by default
``worker/`` beside the per-job install dirs); each job's install dir links its ``venv`` to
it, so stopping or removing a job touches only the job's own dir.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import shlex
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from gpulayer.cloud.bootstrap.plan import BootstrapPlan

if TYPE_CHECKING:
    from gpulayer.cloud.wheelhouse import Wheelhouse

WHEELSET_FORMAT = 1
WORKER_VENV_FIELD = "worker-venv"


@dataclass(frozen=True)
class WorkerInstall:
    """What the probe found of the install this bootstrap wants."""

    key: str
    directory: str
    valid: bool
    why: str | None
    """Why it cannot be reused (``not installed``, ``venv/lib/.../x.py changed``); None when
    it can."""

    @property
    def venv(self) -> str:
        return posixpath.join(self.directory, "venv")


@cache
def host_source() -> str:
    """The host side's source, as the host's python runs it with ``-c``."""
    return (Path(__file__).with_name("host_worker.py")).read_text()


def default_worker_root(install_dir: str) -> str:
    """Beside the per-job install dirs, shared by the jobs of one host."""
    return posixpath.join(posixpath.dirname(install_dir), "worker")


def worker_root(plan: BootstrapPlan) -> str:
    return plan.worker_root or default_worker_root(plan.install_dir)


def wheelset_digest(wheelhouse: Wheelhouse, *, system_site_packages: bool) -> str:
    """The controller's half of an install's identity: the gpulayer version, every wheel's
    name and digest, and the venv's options. The host adds its interpreter."""
    identity = {
        "format": WHEELSET_FORMAT,
        "gpulayer": wheelhouse.gpulayer_version,
        "wheels": sorted([w.name, w.sha256] for w in wheelhouse.files),
        "system_site_packages": system_site_packages,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def worker_probe_args(plan: BootstrapPlan, wheelhouse: Wheelhouse) -> list[str]:
    """What the probe is told to look for: the root, the wheel set, the version."""
    digest = wheelset_digest(wheelhouse, system_site_packages=plan.system_site_packages)
    return [worker_root(plan), digest, wheelhouse.gpulayer_version or "0"]


def install_worker_command(
    plan: BootstrapPlan, wheelhouse: Wheelhouse, wheelhouse_dir: str, time_limit: float
) -> str:
    """Host command: build the install (or take the one another bootstrap just built), bounded
    by ``timeout`` where the host has it; prints ``gpulayer-bootstrap: worker-venv=PATH``."""
    root, digest, version = worker_probe_args(plan, wheelhouse)
    argv = [plan.python, "-c", host_source(), "install", root, digest, version, wheelhouse_dir]
    argv.append("1" if plan.system_site_packages else "0")
    bounded = ["timeout", "-k", "5", str(max(1, int(time_limit))), *argv]
    return (
        f"if command -v timeout >/dev/null 2>&1; then exec {shlex.join(bounded)}; "
        f"else exec {shlex.join(argv)}; fi"
    )


def read_worker_state(data: object) -> WorkerInstall | None:
    """The probe's ``worker`` field; None when it has none (a host refused earlier)."""
    if not isinstance(data, dict) or not data.get("dir"):
        return None
    why = data.get("why")
    return WorkerInstall(
        key=str(data.get("key", "")),
        directory=str(data["dir"]),
        valid=bool(data.get("valid")),
        why=str(why) if why is not None else None,
    )
