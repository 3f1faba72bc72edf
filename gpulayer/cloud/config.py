"""Which providers are enabled, and their settings: `providers.yaml` in the gpulayer home.

    aws:
      regions: [us-east-1, us-west-2]
      allow_spot: true
    ssh:
      hosts:
        - {name: box1, address: 10.0.0.5, key_path: ~/.ssh/id_ed25519, hourly_price: 1.2}

A provider is enabled when it is listed here (and installed). GPULAYER_PROVIDERS_FILE moves the
file. The orchestrator-wide keys live under `gpulayer:` (e.g. `ssh_cidr`, `deadman_seconds`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpulayer.errors import UsageError

ORCHESTRATOR_KEY = "gpulayer"


def providers_file(root: Path) -> Path:
    configured = os.environ.get("GPULAYER_PROVIDERS_FILE")
    return Path(configured).expanduser() if configured else root / "providers.yaml"


def load_config(root: Path) -> dict[str, Any]:
    path = providers_file(root)
    if not path.exists():
        return {}
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: must map provider names to their settings")
    return data


def provider_settings(root: Path) -> dict[str, Mapping[str, Any]]:
    """Enabled provider name -> its settings mapping."""
    return {
        name: settings or {}
        for name, settings in load_config(root).items()
        if name != ORCHESTRATOR_KEY
    }


def orchestrator_settings(root: Path) -> Mapping[str, Any]:
    found = load_config(root).get(ORCHESTRATOR_KEY) or {}
    if not isinstance(found, dict):
        raise UsageError(f"{providers_file(root)}: {ORCHESTRATOR_KEY}: must be a mapping")
    return found


def enabled_providers(root: Path, only: Sequence[str] = ()) -> dict[str, Any]:
    """Provider objects for the enabled providers (restricted to `only` when given)."""
    from gpulayer.cloud.registry import available_providers, get_provider

    installed = set(available_providers())
    chosen = {}
    for name, settings in provider_settings(root).items():
        if only and name not in only:
            continue
        if name not in installed:
            raise UsageError(
                f"providers.yaml: provider {name!r} is not installed (pip install gpulayer-{name})"
            )
        chosen[name] = get_provider(name, settings)
    return chosen
