"""Provider plugins are found through the gpulayer.providers entry points, lazily."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpulayer.cloud.errors import ProviderNotInstalled, ProviderSettingsError
from gpulayer.cloud.protocol import Provider
from gpulayer.cloud.registry import available_providers, get_provider


def test_installed_aws_plugin_is_listed_and_built() -> None:
    assert "aws" in available_providers()
    provider = get_provider("aws", {"regions": ["us-west-2"]})
    assert isinstance(provider, Provider)
    assert provider.name == "aws"


def test_unknown_provider_names_what_is_installed() -> None:
    with pytest.raises(ProviderNotInstalled) as info:
        get_provider("nimbus")
    assert "no provider is called 'nimbus'" in str(info.value)
    assert "aws" in str(info.value)


def test_plugin_settings_are_validated() -> None:
    with pytest.raises(ProviderSettingsError, match="regions"):
        get_provider("aws", {"regions": []})


def test_listing_and_building_do_not_import_the_sdk() -> None:
    script = (
        "import json, sys\n"
        "from gpulayer.cloud.registry import available_providers, get_provider\n"
        "names = available_providers()\n"
        "listed = 'gpulayer_aws' in sys.modules\n"
        "get_provider('aws', {})\n"
        "print(json.dumps({'names': names, 'listed_imports_plugin': listed,\n"
        "  'sdk': sorted(m for m in ('boto3', 'botocore') if m in sys.modules)}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    seen = json.loads(out)
    assert "aws" in seen["names"]
    assert seen["listed_imports_plugin"] is False
    assert seen["sdk"] == []
