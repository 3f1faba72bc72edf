"""A control plane's ProviderRegistry: one provider per state of providers.yaml and of the
provider's credential sources, with the real aws plugin and real files."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpulayer.cloud.config import ConfigError
from gpulayer.cloud.credentials import using_environment
from gpulayer.cloud.provider_registry import BUILT_PER_SETTINGS, ProviderRegistry


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("GPULAYER_PROVIDERS_FILE", raising=False)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    write(tmp_path, regions=["us-east-1"])
    return tmp_path


def write(home: Path, *, comment: str = "", **aws: object) -> None:
    text = yaml.safe_dump({"aws": {"cache_dir": str(home / "cache"), **aws}})
    (home / "providers.yaml").write_text(text + comment)


def test_the_same_settings_give_the_same_provider(home: Path) -> None:
    registry = ProviderRegistry(home)
    first = registry.enabled()["aws"]
    assert all(registry.enabled()["aws"] is first for _ in range(5))
    assert registry.enabled(("aws",))["aws"] is first
    assert registry.enabled(("gcp",)) == {}
    assert registry.orchestrator()["cloud_wait_seconds"] > 0


def test_new_file_content_builds_a_new_provider(home: Path) -> None:
    registry = ProviderRegistry(home)
    first = registry.enabled()["aws"]
    write(home, regions=["us-east-1"], comment="# edited\n")  # any change of content
    second = registry.enabled()["aws"]
    assert second is not first
    write(home, regions=["us-west-2"])
    third = registry.enabled()["aws"]
    assert third is not second and third.settings.regions == ["us-west-2"]  # type: ignore[attr-defined]
    assert registry.enabled()["aws"] is third


def test_a_file_that_stops_validating_is_refused_until_fixed(home: Path) -> None:
    registry = ProviderRegistry(home)
    registry.enabled()
    write(home, regions=[])
    for _ in range(2):
        with pytest.raises(ConfigError, match=r"aws\.regions"):
            registry.enabled()
    write(home, regions=["us-east-1"])
    assert "aws" in registry.enabled()


def test_credentials_from_another_environment_get_a_provider_of_their_own(home: Path) -> None:
    registry = ProviderRegistry(home)
    own = registry.enabled()["aws"]
    alice = {"AWS_ACCESS_KEY_ID": "AKIAALICE", "AWS_SECRET_ACCESS_KEY": "a"}
    with using_environment(alice):
        for_alice = registry.enabled()["aws"]
        assert registry.enabled()["aws"] is for_alice
    assert for_alice is not own
    assert registry.enabled()["aws"] is own  # each state is kept, not rebuilt on return


def test_a_changed_credentials_file_builds_a_new_provider(home: Path) -> None:
    registry = ProviderRegistry(home)
    before = registry.enabled()["aws"]
    (home / "aws-credentials").write_text("[default]\naws_access_key_id = AKIAROTATED\n")
    after = registry.enabled()["aws"]
    assert after is not before
    assert registry.enabled()["aws"] is after


def test_states_kept_per_settings_are_bounded(home: Path) -> None:
    registry = ProviderRegistry(home)
    first = registry.enabled()["aws"]
    for n in range(BUILT_PER_SETTINGS):
        with using_environment({"AWS_ACCESS_KEY_ID": f"AKIA{n}", "AWS_SECRET_ACCESS_KEY": "s"}):
            registry.enabled()
    assert registry.enabled()["aws"] is not first  # the oldest was let go
