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
import os
from collections.abc import Iterator, Mapping
from contextvars import ContextVar

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
