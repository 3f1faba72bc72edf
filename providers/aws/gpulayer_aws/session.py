"""boto3 clients, made on first use (importing boto3 costs a noticeable fraction of a second,
and a provider that is only listed or configured never needs it)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpulayer.cloud import CredentialSources, credentials_environment
from gpulayer_aws.errors import aws_errors
from gpulayer_aws.settings import AwsSettings

# The Pricing API answers from a few regions only; us-east-1 serves every region's prices.
PRICING_REGION = "us-east-1"


# The environment names boto3 reads credentials from, in its own order: keys, then a profile
# of the shared files (which may live elsewhere).
_KEY_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
_FILE_VARIABLES = {
    "AWS_SHARED_CREDENTIALS_FILE": "credentials_file",
    "AWS_CONFIG_FILE": "config_file",
}


class Clients:
    """One boto3 session per set of credentials and one client per (service, region, those
    credentials), shared by threads: boto3 clients are thread-safe, sessions are not, so
    clients are made under a lock.

    Credentials come from :func:`gpulayer.cloud.credentials_environment` (the environment of
    the submit a job came from, else this process's), read when a client is first needed."""

    def __init__(self, settings: AwsSettings, *, wait_seconds: float | None = None) -> None:
        self._settings = settings
        # Bounds each request's connect and read, without retries; None: boto3's usual.
        self._wait_seconds = wait_seconds
        self._lock = threading.Lock()
        self._sessions: dict[tuple[str, ...], Any] = {}
        self._clients: dict[tuple[str, str, tuple[str, ...]], Any] = {}

    def ec2(self, region: str) -> Any:
        return self._client("ec2", region)

    def identity(self) -> str:
        """Whose credentials the next client would use, as a digest of what names them (the
        key id, the profile, the files; never a secret): what one caller fetched is kept for
        that caller, so a shell without credentials is never shown another's answers."""
        inputs = dict(zip(_INPUTS, _credential_inputs(credentials_environment()), strict=True))
        named = [inputs[name] for name in _INPUTS if name not in _SECRET_VARIABLES]
        text = "\0".join([self._settings.profile or "", *named])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def pricing(self) -> Any:
        return self._client("pricing", PRICING_REGION)

    def _client(self, service: str, region: str) -> Any:
        credentials = _credential_inputs(credentials_environment())
        key = (service, region, credentials)
        client = self._clients.get(key)
        if client is not None:
            return client
        with self._lock, aws_errors(region):
            client = self._clients.get(key)
            if client is None:
                client = self._make(service, region, credentials)
                self._clients[key] = client
        return client

    def _session(self, credentials: tuple[str, ...]) -> Any:
        session = self._sessions.get(credentials)
        if session is None:
            session = _session(self._settings.profile, dict(zip(_INPUTS, credentials, strict=True)))
            self._sessions[credentials] = session
        return session

    def _make(self, service: str, region: str, credentials: tuple[str, ...]) -> Any:
        from botocore.config import Config

        # A bounded wait is given up, not retried: retries would multiply the bound.
        attempts = 1 if self._wait_seconds else self._settings.max_attempts
        config = Config(
            retries={"mode": "standard", "max_attempts": attempts},
            connect_timeout=min(10, self._wait_seconds or 10),
            read_timeout=self._wait_seconds or 60,
            user_agent_extra="gpulayer",
        )
        return self._session(credentials).client(
            service,
            region_name=region,
            endpoint_url=self._settings.endpoint_url,
            config=config,
        )


_INPUTS = (*_KEY_VARIABLES, "AWS_PROFILE", *_FILE_VARIABLES)
_SECRET_VARIABLES = frozenset({"AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"})


_DEFAULT_FILES = {
    "AWS_SHARED_CREDENTIALS_FILE": "~/.aws/credentials",
    "AWS_CONFIG_FILE": "~/.aws/config",
}


def credential_sources(environ: Mapping[str, str]) -> CredentialSources:
    """What boto3 reads credentials from under ``environ``: the variables a session is made
    from and the shared files they name (else the default ones)."""
    files = tuple(
        Path(environ.get(variable) or default).expanduser()
        for variable, default in _DEFAULT_FILES.items()
    )
    return CredentialSources(variables=_INPUTS, files=files)


def _credential_inputs(environ: Mapping[str, str]) -> tuple[str, ...]:
    """What of ``environ`` decides the credentials ("" where unset): a key of the caches."""
    return tuple(environ.get(name, "") for name in _INPUTS)


def _session(profile: str | None, given: Mapping[str, str]) -> Any:
    """A boto3 session whose credentials resolve from ``given`` rather than this process's
    environment: keys first, else the profile (the settings' wins over AWS_PROFILE) of the
    shared files ``given`` names, else the default chain (the default files, instance roles)."""
    import boto3
    import botocore.session

    core = botocore.session.Session()
    for variable, setting in _FILE_VARIABLES.items():
        if given.get(variable):
            core.set_config_variable(setting, given[variable])
    chosen_profile = profile or given.get("AWS_PROFILE") or None
    if chosen_profile:
        core.set_config_variable("profile", chosen_profile)
    if not profile and given.get("AWS_ACCESS_KEY_ID") and given.get("AWS_SECRET_ACCESS_KEY"):
        return boto3.session.Session(
            aws_access_key_id=given["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=given["AWS_SECRET_ACCESS_KEY"],
            aws_session_token=given.get("AWS_SESSION_TOKEN") or None,
            botocore_session=core,
        )
    return boto3.session.Session(botocore_session=core)
