"""Credentials and Compute clients, made on first use: importing google.cloud.compute_v1 costs
about two seconds, and a provider that is only listed, configured or asked for catalog offers
never needs it.

Every client of one provider talks to the same endpoint, so operations are waited for with
``ZoneOperationsClient.wait`` / ``GlobalOperationsClient.wait`` there, never through
``operation.result()``, which builds a client of its own for the public endpoint.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpulayer.cloud import (
    AuthError,
    CredentialSources,
    ProviderSettingsError,
    credentials_environment,
)
from gpulayer_gcp.errors import PROVIDER, gcp_errors
from gpulayer_gcp.settings import GcpSettings

SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]


class Clients:
    """One credential and one client per kind, shared by threads (the REST clients are)."""

    def __init__(self, settings: GcpSettings) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._credentials: Any = None
        self._project: str | None = settings.project
        self._clients: dict[str, Any] = {}

    @property
    def project(self) -> str:
        self._ensure_credentials()
        if not self._project:
            raise ProviderSettingsError(
                "project: the credentials name no project; set project in the gcp settings",
                provider=PROVIDER,
            )
        return self._project

    def instances(self) -> Any:
        return self._client("InstancesClient")

    def zone_operations(self) -> Any:
        return self._client("ZoneOperationsClient")

    def global_operations(self) -> Any:
        return self._client("GlobalOperationsClient")

    def firewalls(self) -> Any:
        return self._client("FirewallsClient")

    def images(self) -> Any:
        return self._client("ImagesClient")

    def machine_types(self) -> Any:
        return self._client("MachineTypesClient")

    def accelerator_types(self) -> Any:
        return self._client("AcceleratorTypesClient")

    def credentials(self) -> Any:
        self._ensure_credentials()
        return self._credentials

    def _ensure_credentials(self) -> None:
        with self._lock:
            if self._credentials is not None:
                return
            with gcp_errors():
                credentials, project = _load_credentials(self._settings)
            self._credentials = credentials
            self._project = self._project or project

    def _client(self, kind: str) -> Any:
        client = self._clients.get(kind)
        if client is not None:
            return client
        credentials = self.credentials()
        with self._lock:
            client = self._clients.get(kind)
            if client is None:
                from google.cloud import compute_v1

                options = {}
                if self._settings.endpoint_url:
                    options["api_endpoint"] = self._settings.endpoint_url
                client = getattr(compute_v1, kind)(
                    transport="rest", credentials=credentials, client_options=options
                )
                self._clients[kind] = client
        return client


_VARIABLES = ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CONFIG")


def credential_sources(settings: GcpSettings, environ: Mapping[str, str]) -> CredentialSources:
    """What the credentials are read from under ``environ``, in :func:`_load_credentials`'s
    order: the settings' file, else the key file the environment names, else the default
    application credentials gcloud writes."""
    named = environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if settings.credentials_file is not None:
        key = settings.credentials_file.expanduser()
    elif named:
        key = Path(named).expanduser()
    else:
        config = Path(environ.get("CLOUDSDK_CONFIG") or "~/.config/gcloud").expanduser()
        key = config / "application_default_credentials.json"
    return CredentialSources(variables=_VARIABLES, files=(key,))


def _load_credentials(settings: GcpSettings) -> tuple[Any, str | None]:
    """The settings' credentials_file, else the key file GOOGLE_APPLICATION_CREDENTIALS names
    in the environment of the submit the job came from (or this process's), else Google's
    default chain. Read each time a provider first needs them, so a replaced key file applies
    to the next step without a restart."""
    import google.auth

    environ = credentials_environment()
    named = environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if settings.credentials_file is not None:
        path = settings.credentials_file.expanduser()
        what = "credentials_file"
    elif named:
        path = Path(named).expanduser()
        what = "GOOGLE_APPLICATION_CREDENTIALS"
    else:
        credentials, project = google.auth.default(scopes=SCOPES)
        return credentials, project
    if not path.is_file():
        raise AuthError(PROVIDER, f"{what} {path} does not exist")
    credentials, project = google.auth.load_credentials_from_file(str(path), scopes=SCOPES)
    return credentials, project or environ.get("GOOGLE_CLOUD_PROJECT") or None
