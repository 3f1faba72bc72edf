"""Which environment a cloud call reads its credentials from.

A local control plane lives longer than the shell that started it: AWS keys exported (or a
GCP key file named) after it started are only in the environment of the `submit` that sent a
job. That environment's cloud names are held in memory for the job, never stored, and every
lifecycle step of the job runs inside :func:`using_environment`, so a provider reading
:func:`credentials_environment` sees the submitter's. Without one (a team server, a job from
before a restart, the reaper) it is this process's own environment. The files the SDKs read
(``~/.aws/credentials``, a key file) are read afresh for each step, so edits apply without a
restart.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

# What the AWS and Google SDKs read from the environment (keys, profiles, credential and config
# files, projects); nothing else of the submitter's environment is kept for a cloud job.
CREDENTIAL_PREFIXES = ("AWS_", "GOOGLE_", "CLOUDSDK_", "GCLOUD_")

_current: ContextVar[Mapping[str, str] | None] = ContextVar("gpulayer_cloud_env", default=None)


def credential_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The names of ``environ`` that cloud SDKs read credentials and settings from."""
    return {k: v for k, v in environ.items() if k.startswith(CREDENTIAL_PREFIXES)}


@contextlib.contextmanager
def using_environment(environ: Mapping[str, str] | None) -> Iterator[None]:
    """Cloud calls made inside read credentials from ``environ`` (when it names any)."""
    token = _current.set(dict(environ) if environ else None)
    try:
        yield
    finally:
        _current.reset(token)


def credentials_environment() -> Mapping[str, str]:
    """The environment to read cloud credentials from now: the submitter's cloud variables
    while one of its job's steps runs, else this process's environment."""
    chosen = _current.get()
    return chosen if chosen is not None else os.environ


@dataclass(frozen=True)
class CredentialSources:
    """Where a provider reads its credentials from: environment variables and files. A
    provider is built again when any of them changes (see :class:`ReadsCredentials`)."""

    variables: tuple[str, ...] = ()
    files: tuple[Path, ...] = ()

    def digest(self, environ: Mapping[str, str]) -> str:
        """A digest of what the sources hold now: the variables' values in ``environ`` and
        the files' contents. It lives in memory only, as a cache key; no value is kept."""
        digest = hashlib.sha256()
        for name in sorted(set(self.variables)):
            value = environ.get(name)
            digest.update(f"{name}\0{'-' if value is None else '=' + value}\n".encode())
        for path in sorted(set(self.files)):
            try:
                content = b"=" + path.read_bytes()
            except OSError:
                content = b"-"  # missing or unreadable: its appearance is a change too
            digest.update(f"{path}\0".encode() + hashlib.sha256(content).digest())
        return digest.hexdigest()


@runtime_checkable
class ReadsCredentials(Protocol):
    """An ability: the provider's clients hold credentials read from the environment and
    from files. The registry keeps one provider per state of those sources and builds a new
    one when they change (a rotated key, another submitter's environment), so clients made
    with old credentials are not used again."""

    def credential_sources(self, environ: Mapping[str, str]) -> CredentialSources:
        """The variables and files the provider's credentials come from under ``environ``."""
        ...
