"""A provider plugin's optional abilities are protocols and mixins it inherits, checked once
when the registry loads it: the shipped plugins are what they declare, and a plugin that
declares an ability it does not implement (or implements with other parameters) is refused at
load with one line, through the real entry-point group and the real command line."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpulayer.cloud.catalogs import CatalogProvider, CatalogRefresher, NamesRegions
from gpulayer.cloud.contract import ProviderContractError, check_plugin_class
from gpulayer.cloud.credentials import ReadsCredentials
from gpulayer.cloud.offer import Offer, OfferQuery
from gpulayer.cloud.protocol import (
    GangProvider,
    Instance,
    LaunchRequest,
    OffersAreMachines,
    OutlivesReclaim,
    Provider,
)
from gpulayer.cloud.registry import get_provider, settings_model

EVERY_ABILITY = (
    GangProvider,
    CatalogProvider,
    CatalogRefresher,
    NamesRegions,
    ReadsCredentials,
    OffersAreMachines,
    OutlivesReclaim,
)


def _plugin(name: str, tmp_path: Path) -> Any:
    settings: dict[str, Any] = {
        "aws": {"cache_dir": str(tmp_path)},
        "gcp": {"cache_dir": str(tmp_path), "endpoint_url": "http://127.0.0.1:9"},
        "ssh": {
            "hosts": [{"name": "box", "address": "127.0.0.1", "key_path": str(tmp_path / "k")}],
            "state_dir": str(tmp_path / "state"),
        },
        "slurm": {
            "clusters": {
                "lab": {"login": "127.0.0.1", "user": "u", "key_file": str(tmp_path / "k")}
            },
            "state_dir": str(tmp_path / "state"),
        },
    }[name]
    return get_provider(name, settings)


@pytest.mark.parametrize(
    ("name", "abilities"),
    [
        ("aws", {GangProvider, CatalogProvider, CatalogRefresher, NamesRegions, ReadsCredentials}),
        ("gcp", {GangProvider, CatalogProvider, CatalogRefresher, NamesRegions, ReadsCredentials}),
        ("ssh", {GangProvider, OffersAreMachines}),
        ("slurm", {GangProvider, OutlivesReclaim}),
    ],
)
def test_each_shipped_plugin_is_what_it_declares(
    name: str, abilities: set[type], tmp_path: Path
) -> None:
    provider = _plugin(name, tmp_path)
    assert isinstance(provider, Provider)
    assert {a for a in EVERY_ABILITY if isinstance(provider, a)} == abilities
    # Declared, not merely matched: each inherits what it claims.
    assert {a for a in EVERY_ABILITY if a in type(provider).__mro__} == abilities


class _Verbs:
    """The five verbs, for the malformed plugins below to build on."""

    name = "broken"

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        self.settings = settings

    def offers(self, query: OfferQuery) -> list[Offer]:
        return []

    def launch(self, offer: Offer, request: LaunchRequest) -> Instance:
        raise NotImplementedError

    def describe(self, ids: Sequence[str]) -> list[Instance]:
        return []

    def terminate(self, ids: Sequence[str]) -> None:
        return None

    def list_owned(self, tags: Mapping[str, str]) -> list[Instance]:
        return []


class DeclaredGangWithout(_Verbs, GangProvider):
    pass


class GangOfOtherShape(_Verbs, GangProvider):
    def launch_gang(self, offer: Offer) -> list[Instance]:  # type: ignore[override]
        return []


class CatalogWithoutEverywhere(_Verbs, CatalogProvider):
    def catalog_offers(self, query: OfferQuery) -> list[Offer]:  # type: ignore[override]
        return []

    def catalog_info(self) -> Any:
        return None


class UndeclaredCatalogOfOtherShape(_Verbs):
    """Not declared, yet isinstance would call it a CatalogProvider: held to the shape too."""

    def catalog_offers(self, query: OfferQuery, region: str) -> list[Offer]:
        return []

    def catalog_info(self) -> Any:
        return None


class MarkerAttribute(_Verbs):
    offers_are_machines = True


class VerbOfOtherShape(_Verbs):
    def terminate(self) -> None:  # type: ignore[override]
        return None


@pytest.mark.parametrize(
    ("plugin", "line"),
    [
        (DeclaredGangWithout, "as a GangProvider, it does not define launch_gang"),
        (
            GangOfOtherShape,
            "as a GangProvider, launch_gang(offer) does not take launch_gang(offer, request)",
        ),
        (
            CatalogWithoutEverywhere,
            "as a CatalogProvider, catalog_offers(query) does not take "
            "catalog_offers(query, *, everywhere=...)",
        ),
        (
            UndeclaredCatalogOfOtherShape,
            "as a CatalogProvider, catalog_offers(query, region) does not take "
            "catalog_offers(query, *, everywhere=...)",
        ),
        (MarkerAttribute, "offers_are_machines decides nothing; inherit "),
        (VerbOfOtherShape, "as a Provider, terminate() does not take terminate(ids)"),
    ],
)
def test_a_malformed_ability_is_refused_in_one_line(plugin: type, line: str) -> None:
    with pytest.raises(ProviderContractError) as info:
        check_plugin_class(plugin, "provider 'broken' (tests:Plugin)")
    message = str(info.value)
    assert line in message, message
    assert message.startswith("provider 'broken' (tests:Plugin): ")
    assert "\n" not in message


def test_well_formed_plugins_pass_with_extra_optional_parameters() -> None:
    class Wider(_Verbs, GangProvider):
        def launch_gang(
            self, offer: Offer, request: LaunchRequest, *, dry: bool = False
        ) -> list[Instance]:
            return []

    check_plugin_class(Wider, "provider 'wider' (tests:Wider)")
    assert isinstance(Wider(), GangProvider)


_BROKEN_PLUGIN = """
from gpulayer.cloud import GangProvider


class Broken(GangProvider):
    name = "broken"

    def __init__(self, settings=None):
        self.settings = settings

    def offers(self, query):
        return []

    def launch(self, offer, request):
        raise NotImplementedError

    def launch_gang(self, offer):
        return []

    def describe(self, ids):
        return []

    def terminate(self, ids):
        return None

    def list_owned(self, tags):
        return []
"""


def _install_broken(where: Path) -> None:
    """A distribution on ``where`` registering ``broken`` in the gpulayer.providers group."""
    where.mkdir()
    (where / "gpulayer_broken.py").write_text(_BROKEN_PLUGIN)
    info = where / "gpulayer_broken-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gpulayer-broken\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[gpulayer.providers]\nbroken = gpulayer_broken:Broken\n"
    )


def test_a_plugin_found_by_its_entry_point_is_refused_when_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install_broken(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for load in (lambda: get_provider("broken"), lambda: settings_model("broken")):
        with pytest.raises(ProviderContractError, match="launch_gang"):
            load()


def test_config_check_refuses_the_plugin_in_one_line(tmp_path: Path) -> None:
    _install_broken(tmp_path / "site")
    home = tmp_path / "home"
    home.mkdir()
    (home / "providers.yaml").write_text("broken: {}\n")
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "GPULAYER_HOME": str(home),
        "PYTHONPATH": str(tmp_path / "site"),
    }
    result = subprocess.run(
        [sys.executable, "-m", "gpulayer", "config", "check"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "provider 'broken' (gpulayer_broken:Broken): as a GangProvider, " in lines[0]
    assert "launch_gang(offer) does not take launch_gang(offer, request)" in lines[0]
