"""Does the host's sshd read the file a launch writes the job's key to? Checked before any job
is submitted (`gpulayer config check`): log in with the provider's own key, write a throwaway
key where the job key would go (marked like a launch's line, so only it is removed again), and
log in with the throwaway key. A host that answers and refuses it reads another file: the
problem is the line a refused job key gets at launch, naming the setting to change.

A plugin whose launches write the job key over SSH lists where with ``job_key_logins()``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpulayer.cloud.config import CheckedConfig
    from gpulayer.cloud.protocol import JobKeyFile
    from gpulayer.ssh.hostkeys import HostKeyStore
    from gpulayer.ssh.session import SshSession
    from gpulayer.ssh.target import SshTarget

CHECK_SECONDS = 20.0
"""How long one host's check may take (two logins and two short commands)."""


@dataclass(frozen=True)
class JobKeyLogin:
    """A host a launch writes the job key on, as the provider itself logs into it."""

    name: str
    """What the check's line names (``ssh host-1``, ``slurm cluster-a login node``)."""
    target: SshTarget
    """With the provider's own login key."""
    key_file: JobKeyFile
    host_keys_dir: Path | None = None
    """Where the provider keeps the host keys it pinned; None: trust the first key seen."""


@dataclass(frozen=True)
class KeyCheck:
    name: str
    problem: str | None
    """None: the host accepted a key written where the job key goes."""

    @property
    def ok(self) -> bool:
        return self.problem is None


def configured_logins(checked: CheckedConfig) -> list[JobKeyLogin]:
    """The logins of every enabled provider that writes job keys over SSH."""
    from gpulayer.cloud.config import IDLE_KEY
    from gpulayer.cloud.registry import factory_has, get_provider

    logins: list[JobKeyLogin] = []
    for name in sorted(checked.providers):
        if not factory_has(name, "job_key_logins"):
            continue
        section = {k: v for k, v in (checked.data.get(name) or {}).items() if k != IDLE_KEY}
        logins.extend(get_provider(name, section).job_key_logins())  # type: ignore[attr-defined]
    return logins


def check_all(logins: Sequence[JobKeyLogin], seconds: float = CHECK_SECONDS) -> list[KeyCheck]:
    """Every login checked at once (each within ``seconds``), in the order given."""
    if not logins:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(logins))) as pool:
        return list(pool.map(lambda login: check_one(login, seconds), logins))


def check_one(login: JobKeyLogin, seconds: float = CHECK_SECONDS) -> KeyCheck:
    from gpulayer.ssh.errors import SshError
    from gpulayer.ssh.hostkeys import JsonHostKeyStore, MemoryHostKeyStore

    deadline = time.monotonic() + seconds
    store = JsonHostKeyStore(login.host_keys_dir) if login.host_keys_dir else MemoryHostKeyStore()
    try:
        session = _session(login.target, store, deadline)
    except SshError as exc:
        return KeyCheck(login.name, f"cannot log in with {login.target.key_path}: {exc}")
    try:
        return KeyCheck(login.name, _try_job_key(login, session, store, deadline))
    finally:
        session.close()


def _try_job_key(
    login: JobKeyLogin, session: SshSession, store: HostKeyStore, deadline: float
) -> str | None:
    from gpulayer.cloud.lifecycle.results import key_refused_line
    from gpulayer.ssh.authorized_keys import (
        add_authorized_key_command,
        remove_authorized_key_command,
    )
    from gpulayer.ssh.errors import SshAuthError, SshError
    from gpulayer.ssh.keys import generate_keypair

    path = login.key_file.path
    marker = f"config-check-{secrets.token_hex(6)}"
    with tempfile.TemporaryDirectory(prefix="gpulayer-key-check-") as folder:
        pair = generate_keypair(Path(folder), "check", comment=marker)
        added = session.run(
            add_authorized_key_command(path, pair.public_key, marker), timeout=_left(deadline)
        )
        if added.exit_code != 0:
            said = (added.stderr or added.stdout).strip().splitlines()[-1:] or ["no output"]
            return f"{login.key_file.setting}: cannot write {path}: {said[0]}"
        try:
            throwaway = dataclasses.replace(login.target, key_path=pair.private_path)
            _session(throwaway, store, deadline).close()
        except SshAuthError:
            return key_refused_line(login.key_file)
        except SshError as exc:
            return f"a login with a key written to {path} failed: {exc}"
        finally:
            with contextlib.suppress(SshError):
                session.run(remove_authorized_key_command(path, marker), timeout=10)
    return None


def _session(target: SshTarget, store: HostKeyStore, deadline: float) -> SshSession:
    from gpulayer.ssh.session import SshSession

    return SshSession(target, host_keys=store).connect(timeout=_left(deadline))


def _left(deadline: float) -> float:
    # A step started at the very end still gets a moment: it fails on its own timeout.
    return max(1.0, deadline - time.monotonic())
