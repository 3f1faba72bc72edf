"""The enabled providers of one gpulayer home, each built once per settings change.

A long-running control plane asks this at every step. It builds a provider once per state of
its settings (providers.yaml's bytes and the installed distributions, see
:mod:`gpulayer.cloud.installed`) and of its credential sources (see
:class:`~gpulayer.cloud.credentials.ReadsCredentials`), so the steps share the provider's
clients and caches, while an edited file, a plugin installed since or a rotated key still
applies to the next step.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpulayer.cloud.config import CheckedConfig, check_text, provider_sections, providers_file
from gpulayer.cloud.credentials import ReadsCredentials, credentials_environment
from gpulayer.cloud.installed import installed_key
from gpulayer.cloud.protocol import Provider
from gpulayer.cloud.registry import get_provider

BUILT_PER_SETTINGS = 8
"""Providers kept per plugin for one providers.yaml: one per state of its credential sources
(each submitter's environment is one), the oldest dropped first."""


@dataclass
class _Settings:
    """One state of providers.yaml: its digest, what it validated into, what was built."""

    digest: str
    checked: CheckedConfig | Exception
    """What the file validated into, or the ConfigError/UsageError it raised (again at each
    use, as the file says the same thing until it changes)."""
    built: dict[str, dict[str, Provider]] = field(default_factory=dict)
    """Provider name -> credential digest -> the provider built for it."""


class ProviderRegistry:
    """The enabled providers of one gpulayer home, built once per settings change.

    Each lookup reads providers.yaml (a small file) and hashes its text with the sys.path
    folders' mtimes; a provider is built again only when they changed, or when what its
    credentials are read from did. Safe to share between threads."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._current: _Settings | None = None

    def checked(self) -> CheckedConfig:
        """providers.yaml validated whole; raises its ConfigError."""
        checked = self._settings().checked
        if isinstance(checked, Exception):
            raise checked
        return checked

    def orchestrator(self) -> Mapping[str, Any]:
        """The ``gpulayer:`` section, validated, every default filled in, with each
        provider's own ``idle_seconds`` (``provider_idle_seconds``) and the fleets
        (``fleets``: their FleetSettings; ``fleet_rules``: what decisions read of them)."""
        checked = self.checked()
        return {
            **checked.orchestrator.model_dump(),
            "provider_idle_seconds": dict(checked.idle_seconds),
            "fleets": list(checked.fleets),
            "fleet_rules": checked.fleet_rules(),
        }

    def enabled(self, only: Sequence[str] = ()) -> dict[str, Provider]:
        """The enabled providers (those named in ``only`` when given), each the one built
        for the settings and credentials in effect now."""
        state = self._settings()
        checked = state.checked
        if isinstance(checked, Exception):
            raise checked
        sections = provider_sections(checked.data)
        chosen: dict[str, Provider] = {}
        for name, section in sections.items():
            if (only and name not in only) or name not in checked.providers:
                continue
            chosen[name] = self._provider(state, name, section)
        return chosen

    def _settings(self) -> _Settings:
        path = providers_file(self.root)
        try:
            text: str | None = path.read_text()
        except FileNotFoundError:
            text = None
        digest = hashlib.sha256(f"{path}\0{'-' if text is None else '=' + text}".encode())
        # A plugin installed (or removed) since: validated and built again, as for an edit.
        digest.update(repr(installed_key()).encode())
        key = digest.hexdigest()
        with self._lock:
            if self._current is not None and self._current.digest == key:
                return self._current
        checked: CheckedConfig | Exception
        try:
            checked = check_text(path, text)
        except Exception as exc:  # ConfigError, UsageError, a plugin refused at load
            checked = exc
        state = _Settings(key, checked)
        with self._lock:
            self._current = state
        return state

    def _provider(self, state: _Settings, name: str, section: Mapping[str, Any]) -> Provider:
        environ = credentials_environment()
        with self._lock:
            built = state.built.setdefault(name, {})
            # Any provider built from these settings names the same credential sources.
            model = next(iter(built.values()), None)
        if model is not None:
            wanted = _credentials_key(model, environ)  # reads files: outside the lock
            with self._lock:
                found = built.get(wanted)
            if found is not None:
                return found
        provider = get_provider(name, section)
        key = _credentials_key(provider, environ)
        with self._lock:
            found = built.get(key)
            if found is not None:
                return found  # another thread built it meanwhile: one provider per state
            built[key] = provider
            while len(built) > BUILT_PER_SETTINGS:
                built.pop(next(iter(built)))
        return provider


def _credentials_key(provider: Provider, environ: Mapping[str, str]) -> str:
    if isinstance(provider, ReadsCredentials):
        return provider.credential_sources(environ).digest(environ)
    return ""
