"""docs/settings.md is generated from the settings models and kept current."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulayer.cli.settings_doc import documented_plugins, render_page
from gpulayer.cloud.orchestrator_settings import OrchestratorSettings
from gpulayer.cloud.registry import settings_model

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "settings.md"


def shipped_plugins() -> list[str]:
    return sorted(p.parent.name for p in (ROOT / "providers").glob("*/pyproject.toml"))


def test_every_providers_yaml_section_is_on_the_page() -> None:
    page = PAGE.read_text()
    sections = ["gpulayer", *shipped_plugins()]
    assert "gcp" in sections
    for name in sections:
        assert f"\n## `{name}:`\n" in page, f"docs/settings.md has no `{name}:` section"


def test_a_plugin_without_a_settings_model_stops_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpulayer.cli import settings_doc

    monkeypatch.setattr(settings_doc, "_settings_model", lambda name: None)
    with pytest.raises(settings_doc.UndocumentedSection, match="aws"):
        settings_doc.render_page()


def test_the_page_is_current() -> None:
    assert PAGE.read_text() == render_page(), (
        "docs/settings.md is stale: python -m gpulayer.cli.settings_doc --write docs/settings.md"
    )


def test_every_setting_is_described_and_on_the_page() -> None:
    page = PAGE.read_text()
    assert documented_plugins() == shipped_plugins()
    models = [OrchestratorSettings, *(settings_model(n) for n in documented_plugins())]
    seen = set()
    while models:
        model = models.pop()
        if model in seen:
            continue
        seen.add(model)
        for key, info in model.model_fields.items():
            assert info.description, f"{model.__name__}.{key} has no description"
            assert f"| `{key}` |" in page, key
            annotation = str(info.annotation)
            for inner in ("SshHost", "HostHardware"):
                if inner in annotation:
                    from gpulayer_ssh import settings as ssh_settings

                    models.append(getattr(ssh_settings, inner))
            if "SlurmCluster" in annotation:
                from gpulayer_slurm.settings import SlurmCluster

                models.append(SlurmCluster)
    for key in ("endpoint_url", "use_private_ip", "subnet_ids", "price_source"):
        assert f"| `{key}` |" in page
    for key in ("gpu_types", "hourly_price", "qos", "account", "key_file"):
        assert f"| `{key}` |" in page
    assert "\n### `slurm.clusters.NAME`\n" in page
    for key in ("authorized_keys", "install_root", "python", "hardware", "deadman_action"):
        assert f"| `{key}` |" in page
    assert "| `GPULAYER_PROVIDERS_FILE` |" in page and "| `GPULAYER_IDLE_SECONDS` |" in page
