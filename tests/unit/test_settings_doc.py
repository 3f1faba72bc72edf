"""docs/settings.md is generated from the settings models and kept current."""

from __future__ import annotations

from pathlib import Path

from gpulayer.cli.settings_doc import documented_plugins, render_page
from gpulayer.cloud.orchestrator_settings import OrchestratorSettings
from gpulayer.cloud.registry import settings_model

PAGE = Path(__file__).resolve().parents[2] / "docs" / "settings.md"


def test_the_page_is_current() -> None:
    assert PAGE.read_text() == render_page(), (
        "docs/settings.md is stale: python -m gpulayer.cli.settings_doc --write docs/settings.md"
    )


def test_every_setting_is_described_and_on_the_page() -> None:
    page = PAGE.read_text()
    assert documented_plugins() == ["aws", "ssh"]
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
    for key in ("endpoint_url", "use_private_ip", "subnet_ids", "price_source"):
        assert f"| `{key}` |" in page
    for key in ("authorized_keys", "install_root", "python", "hardware", "deadman_action"):
        assert f"| `{key}` |" in page
    assert "| `GPULAYER_PROVIDERS_FILE` |" in page and "| `GPULAYER_IDLE_SECONDS` |" in page
