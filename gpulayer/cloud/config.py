"""Which providers are enabled, and their settings: `providers.yaml` in the gpulayer home.

    aws:
      regions: [us-east-1, us-west-2]
      allow_spot: true
    ssh:
      hosts:
        - {name: box1, address: 10.0.0.5, key_path: ~/.ssh/id_ed25519, hourly_price: 1.2}

A provider is enabled when it is listed here (and installed). GPULAYER_PROVIDERS_FILE moves the
file. The orchestrator-wide keys live under `gpulayer:` (e.g. `ssh_cidr`, `deadman_seconds`);
named fleets of warm machines under `fleets:` (see gpulayer.cloud.fleets).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpulayer.errors import SpecError, UsageError

if TYPE_CHECKING:
    from gpulayer.cloud.protocol import Provider

ORCHESTRATOR_KEY = "gpulayer"
FLEETS_KEY = "fleets"  # its settings: gpulayer.cloud.fleets
NOT_PROVIDERS = frozenset({ORCHESTRATOR_KEY, FLEETS_KEY})
"""Top-level keys of providers.yaml that are the orchestrator's, not a provider's."""
IDLE_KEY = "idle_seconds"
"""A key of every provider's section that the orchestrator reads itself (how long that
provider's machines stay warm after their job); the plugin never sees it."""


class ConfigError(SpecError):
    """providers.yaml does not validate: one line per problem, each naming the file and the
    key path. Exit code 2, like a JobSpec that does not validate."""


def providers_file(root: Path) -> Path:
    configured = os.environ.get("GPULAYER_PROVIDERS_FILE")
    return Path(configured).expanduser() if configured else root / "providers.yaml"


def load_config(root: Path) -> dict[str, Any]:
    path = providers_file(root)
    if not path.exists():
        return {}
    return parse_config(path, path.read_text())


def parse_config(path: Path, text: str) -> dict[str, Any]:
    """providers.yaml's mapping from its text; UsageError naming ``path`` when it is not one."""
    import yaml

    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: must map provider names to their settings")
    return data


def provider_settings(root: Path) -> dict[str, Mapping[str, Any]]:
    """Enabled provider name -> its settings mapping."""
    return provider_sections(load_config(root))


def provider_sections(data: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The provider sections of providers.yaml's mapping: name -> its settings mapping."""
    return {
        name: _plugin_keys(settings or {})
        for name, settings in data.items()
        if name not in NOT_PROVIDERS
    }


def _plugin_keys(section: Mapping[str, Any]) -> Mapping[str, Any]:
    if not isinstance(section, Mapping) or IDLE_KEY not in section:
        return section
    return {key: value for key, value in section.items() if key != IDLE_KEY}


def fleet_settings_model() -> type[Any]:
    """The model of one entry of ``fleets:`` (for the settings reference)."""
    from gpulayer.cloud.fleets import FleetSettings

    return FleetSettings


def orchestrator_settings(root: Path) -> Mapping[str, Any]:
    """The ``gpulayer:`` section, validated, every default filled in."""
    return check_config(root).orchestrator.model_dump()


def orchestrator_section(root: Path) -> Mapping[str, Any]:
    """The ``gpulayer:`` section alone, validated, every default filled in: for readers that
    go on past problems of other sections (`gpulayer offers` notes an unknown provider)."""
    from pydantic import ValidationError

    from gpulayer.cloud.orchestrator_settings import OrchestratorSettings
    from gpulayer.cloud.settings import settings_problems

    section = load_config(root).get(ORCHESTRATOR_KEY) or {}
    try:
        return OrchestratorSettings.model_validate(section).model_dump()
    except ValidationError as exc:
        lines = settings_problems(OrchestratorSettings, exc)
        path = providers_file(root)
        raise ConfigError([f"{path}: {ORCHESTRATOR_KEY}.{line}" for line in lines]) from None


@dataclass
class CheckedConfig:
    path: Path
    exists: bool
    orchestrator: Any
    """The OrchestratorSettings of the ``gpulayer:`` section."""
    providers: dict[str, Any] = field(default_factory=dict)
    """Enabled provider -> its validated settings model (or the mapping, for a plugin that
    publishes no settings model but accepted the settings)."""
    data: dict[str, Any] = field(default_factory=dict)
    """The file's mapping as read, each section as written."""
    idle_seconds: dict[str, float] = field(default_factory=dict)
    """Provider -> its own ``idle_seconds``, for those that set one."""
    fleets: list[Any] = field(default_factory=list)
    """The FleetSettings of ``fleets:``, in the file's order."""

    def idle_seconds_of(self, provider: str) -> float:
        """How long the provider's machines stay warm after their job (0: not at all)."""
        found = self.idle_seconds.get(provider)
        return float(self.orchestrator.idle_seconds if found is None else found)

    def fleet_rules(self) -> list[Any]:
        """Each fleet's FleetRule (its idle_seconds resolved from its providers')."""
        from gpulayer.cloud.fleets import fleet_rules

        idle = {name: self.idle_seconds_of(name) for name in self.providers}
        return fleet_rules(self.fleets, idle, float(self.orchestrator.idle_seconds))

    def shown(self) -> dict[str, Any]:
        """Every section as JSON, defaults filled in."""
        from pydantic import BaseModel

        sections: dict[str, Any] = {}
        for name, settings in self.providers.items():
            if isinstance(settings, BaseModel):
                sections[name] = settings.model_dump(mode="json")
            else:
                sections[name] = dict(settings)
            if name in self.idle_seconds:
                sections[name][IDLE_KEY] = self.idle_seconds[name]
        sections[ORCHESTRATOR_KEY] = self.orchestrator.model_dump(mode="json")
        if self.fleets:
            sections[FLEETS_KEY] = [fleet.model_dump(mode="json") for fleet in self.fleets]
        return sections


def check_config(root: Path) -> CheckedConfig:
    """Validate providers.yaml whole (every section, ``gpulayer:`` included), raising
    ConfigError with every problem at once."""
    path = providers_file(root)
    return check_text(path, path.read_text() if path.exists() else None)


def check_text(path: Path, text: str | None) -> CheckedConfig:
    """:func:`check_config` of the text read from ``path`` (None: there is no file)."""
    from pydantic import ValidationError

    from gpulayer.cloud.orchestrator_settings import OrchestratorSettings
    from gpulayer.cloud.registry import available_providers
    from gpulayer.cloud.settings import settings_problems

    data = {} if text is None else parse_config(path, text)
    problems: list[str] = []
    orchestrator = OrchestratorSettings()
    checked = CheckedConfig(
        path=path, exists=text is not None, orchestrator=orchestrator, data=data
    )
    installed = available_providers()
    for name, section in data.items():
        name = str(name)
        if name == FLEETS_KEY:
            continue  # checked below, against the provider sections
        if section is None:
            section = {}
        if not isinstance(section, dict):
            problems.append(f"{name}: must be a mapping of settings, not {section!r}")
            continue
        if name == ORCHESTRATOR_KEY:
            try:
                checked.orchestrator = OrchestratorSettings.model_validate(section)
            except ValidationError as exc:
                lines = settings_problems(OrchestratorSettings, exc)
                problems.extend(f"{name}.{line}" for line in lines)
            continue
        if name not in installed:
            from gpulayer.cloud.install_hint import not_installed_line

            problems.append(f"{name}: {not_installed_line(name, installed, [ORCHESTRATOR_KEY])}")
            continue
        if IDLE_KEY in section:
            idle = _idle_seconds(section[IDLE_KEY])
            if isinstance(idle, str):
                problems.append(f"{name}.{IDLE_KEY}: {idle}")
            else:
                checked.idle_seconds[name] = idle
        found = _check_provider(name, _plugin_keys(section))
        if isinstance(found, list):
            problems.extend(f"{name}.{line}" for line in found)
        else:
            checked.providers[name] = found
    from gpulayer.cloud.fleets import fleet_problems

    sections = [str(name) for name in data if str(name) not in NOT_PROVIDERS]
    checked.fleets, wrong = fleet_problems(data.get(FLEETS_KEY), sections)
    problems.extend(wrong)
    if problems:
        raise ConfigError([f"{path}: {line}" for line in problems])
    return checked


def _idle_seconds(value: Any) -> float | str:
    """A provider's idle_seconds, validated as the ``gpulayer:`` section's; else the problem."""
    from pydantic import TypeAdapter, ValidationError

    from gpulayer.cloud.orchestrator_settings import IdleSeconds

    try:
        return float(TypeAdapter(IdleSeconds).validate_python(value))
    except ValidationError as exc:
        return str(exc.errors(include_url=False)[0]["msg"])


def _check_provider(name: str, section: Mapping[str, Any]) -> Any:
    """The provider's validated settings, or its problems as lines."""
    from pydantic import ValidationError

    from gpulayer.cloud.errors import ProviderError
    from gpulayer.cloud.registry import get_provider, settings_model
    from gpulayer.cloud.settings import settings_problems

    model = settings_model(name)  # a plugin that is not what it declares raises here
    if model is not None:
        try:
            return model.model_validate(dict(section))
        except ValidationError as exc:
            return settings_problems(model, exc)
    try:
        get_provider(name, section)  # without a settings model, building it is the check
    except ProviderError as exc:
        return [str(exc).removeprefix(f"{name}: ").removeprefix("settings: ")]
    return dict(section)


def enabled_providers(root: Path, only: Sequence[str] = ()) -> dict[str, Provider]:
    """Provider objects for the enabled providers (restricted to `only` when given), built
    now: for one command. A control plane asks its ProviderRegistry instead."""
    from gpulayer.cloud.registry import available_providers, get_provider

    checked = check_config(root)
    installed = set(available_providers())
    chosen = {}
    for name, settings in provider_settings(root).items():
        if only and name not in only:
            continue
        if name in checked.providers and name in installed:
            chosen[name] = get_provider(name, settings)
    return chosen
