"""The one offer pipeline: gathering, the catalog fallback, listing providers that are not
enabled, and saying why when nothing is listed. Offline: the AWS plugin answers from the
catalog it ships, with no credentials, no network and no providers.yaml."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpulayer.cloud.catalogs import CatalogInfo
from gpulayer.cloud.errors import AuthError
from gpulayer.cloud.offer import Offer, OfferQuery
from gpulayer.cloud.search import gather, list_offers, select, why_nothing_fits
from gpulayer.errors import UsageError
from gpulayer.spec.models import JobSpec
from gpulayer.spec.validate import validate_spec
from tests.support.aws_env import without_aws_credentials


def _offer(name: str, price: float, count: int = 1, provider: str = "fake") -> Offer:
    return Offer(
        provider=provider,
        instance_type=name,
        region="r1",
        accelerator="cuda",
        gpu_name="A100",
        gpu_count=count,
        gpu_memory_gb=80,
        cpu_cores=8,
        hourly_price=price,
    )


class CatalogCloud:
    """A provider plugin at its boundary: a live API that may refuse, and a shipped catalog."""

    def __init__(self, live: Sequence[Offer] | Exception, catalog: Sequence[Offer], as_of: str):
        self._live = live
        self._catalog = list(catalog)
        self._as_of = as_of
        self.catalog_calls: list[bool] = []

    def offers(self, query: OfferQuery) -> list[Offer]:
        if isinstance(self._live, Exception):
            raise self._live
        return list(self._live)

    def catalog_offers(self, query: OfferQuery, *, everywhere: bool = False) -> list[Offer]:
        self.catalog_calls.append(everywhere)
        return list(self._catalog)

    def catalog_info(self) -> CatalogInfo:
        return CatalogInfo(provider="fake", as_of=self._as_of, source="test prices")


TODAY = date.today().isoformat()
QUERY = OfferQuery(accelerator="cuda", gpu_count_exact=False)


def test_live_offers_win_and_a_refusing_api_falls_back_to_the_catalog() -> None:
    live = CatalogCloud([_offer("live", 2.0)], [_offer("shipped", 1.0)], TODAY)
    assert [o.instance_type for o in gather({"fake": live}, QUERY).ranked] == ["live"]
    refused = CatalogCloud(AuthError("fake", "no credentials"), [_offer("x", 1.0)], TODAY)
    strict = gather({"fake": refused}, QUERY)
    assert len(strict.ranked) == 0 and "fake: no offers (" in strict.notes[0]
    listed = gather({"fake": refused}, QUERY, catalog_fallback=True)
    assert [o.instance_type for o in listed.ranked] == ["x"]
    assert listed.sources == {"fake": "catalog"} and refused.catalog_calls == [False]
    assert "listing its catalog" in listed.notes[0]


def test_disabled_catalogs_are_listed_everywhere_and_old_ones_warned_about() -> None:
    old = (date.today() - timedelta(days=45)).isoformat()
    other = CatalogCloud([], [_offer("far", 3.0, provider="other")], old)
    gathered = gather({}, QUERY, disabled={"other": other})
    assert other.catalog_calls == [True]
    assert gathered.enabled == frozenset() and len(gathered.ranked) == 1
    assert any("45 days old" in n and "gpulayer catalog refresh fake" in n for n in gathered.notes)
    fresh = CatalogCloud([], [], TODAY)
    assert not gather({}, QUERY, disabled={"fake": fresh}).notes


def test_why_nothing_fits_names_the_cap_or_the_nearest_count() -> None:
    offers = [_offer("eight", 20.0, count=8), _offer("four", 12.0, count=4)]
    ranked = gather({"fake": CatalogCloud(offers, [], TODAY)}, QUERY).ranked
    spec = _spec(gpu_count=2)
    query = OfferQuery.from_spec(spec)
    result = select(ranked, query, spec.placement)
    assert result.offers == []
    assert why_nothing_fits(ranked, query, spec.placement, result) == (
        "no fake offer has exactly 2 GPUs; four has 4 at 12 USD/h"
    )
    capped = _spec(gpu_count=4, max_hourly_cost=5)
    query = OfferQuery.from_spec(capped)
    result = select(ranked, query, capped.placement)
    assert why_nothing_fits(ranked, query, capped.placement, result) == (
        "max_hourly_cost 5 USD is below every offer that fits; the cheapest is fake/r1/four "
        "at 12 USD/h"
    )


def test_a_job_no_provider_could_answer_for_is_told_each_providers_failure() -> None:
    from gpulayer.cloud.lifecycle.placement import candidates

    spec = _spec(gpu_count=1)
    old = (date.today() - timedelta(days=90)).isoformat()
    refused = CatalogCloud(AuthError("fake", "no credentials"), [], TODAY)
    found = candidates(spec, {"fake": refused}, [], "j-1", lambda text: None)
    assert found.never is not None and found.never.startswith("fake: no offers (")
    assert "no credentials" in found.never
    # A provider that answered with nothing, from an old catalog, fails nobody: the old
    # catalog's note is not the reason.
    empty = CatalogCloud([], [], old)
    found = candidates(spec, {"fake": empty}, [], "j-1", lambda text: None)
    assert found.never == "no offers at all"


def _spec(**resources: Any) -> JobSpec:
    placement = {
        k: resources.pop(k) for k in ("max_hourly_cost", "providers", "regions") if k in resources
    }
    return validate_spec(
        {
            "workload": {"kind": "command", "command": ["true"]},
            "resources": {"accelerator": "cuda", **resources},
            "placement": placement,
        }
    )


# --- listing with the real AWS plugin, offline ----------------------------------------------


@pytest.fixture
def no_aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    without_aws_credentials(monkeypatch, tmp_path)


def _home() -> Path:
    from gpulayer.control.paths import home

    return home().ensure().root


def test_offline_without_providers_yaml_aws_lists_a100_from_its_catalog(
    no_aws_credentials: None,
) -> None:
    listing = list_offers(
        _home(), _spec(gpu_models=["A100"], providers=["aws"]), gpu_count_exact=False, limit=500
    )
    rows = listing["offers"]
    assert rows and {r["gpu_name"] for r in rows} == {"A100"}
    assert {r["instance_type"] for r in rows} == {"p4d.24xlarge", "p4de.24xlarge"}
    assert all(not r["enabled"] and r["source"] == "catalog" for r in rows)
    assert len({r["region"] for r in rows}) >= 8 and all(r["zones"] for r in rows)
    # What `aws: {}` would rent: on-demand only, since allow_spot is off by default.
    assert not any(r["spot"] for r in rows)
    assert listing["catalogs"][0]["provider"] == "aws" and listing["catalogs"][0]["as_of"]
    path = str(_home() / "providers.yaml")
    assert any(n.startswith("no provider is enabled") and path in n for n in listing["notes"])
    assert any(f"add `aws: {{}}` to {path}" in n for n in listing["notes"])


def test_slices_of_a_gpu_are_listed_for_a_job_that_accepts_them(
    no_aws_credentials: None, capsys: pytest.CaptureFixture[str]
) -> None:
    whole = list_offers(_home(), _spec(gpu_models=["L4"], providers=["aws"], regions=["us-east-1"]))
    assert whole["offers"] and not any(r["gpu_slice"] for r in whole["offers"])
    sliced = list_offers(
        _home(),
        _spec(gpu_models=["L4"], gpu_slices=True, providers=["aws"], regions=["us-east-1"]),
    )
    first = sliced["offers"][0]
    assert (first["instance_type"], first["gpu_slice"], first["hourly_price"]) == (
        "g6f.large",
        0.125,
        0.202,
    )
    from gpulayer.cli.offers_view import offers_table

    offers_table(sliced)
    row = next(line for line in capsys.readouterr().out.splitlines() if "g6f.large" in line)
    assert "1x 1/8 L4 2.79GB" in row


def test_exactly_one_a100_names_the_nearest_machine(no_aws_credentials: None) -> None:
    listing = list_offers(_home(), _spec(gpu_models=["A100"], providers=["aws"]))
    assert listing["offers"] == []
    # The cheapest on-demand p4d: 21.95764 USD/h in us-east-2 and us-west-2.
    assert (
        "no aws offer has exactly 1 A100; p4d.24xlarge has 8 at 21.95764 USD/h"
        in (listing["notes"])
    )


def test_unknown_provider_names_the_closest(no_aws_credentials: None) -> None:
    with pytest.raises(UsageError, match="'awss' is not an installed provider; did you mean 'aws'"):
        list_offers(_home(), _spec(providers=["awss"]))


def test_enabled_without_credentials_lists_its_catalog_for_its_regions(
    no_aws_credentials: None,
) -> None:
    (_home() / "providers.yaml").write_text("aws:\n  regions: [eu-west-1]\nazur: {}\n")
    listing = list_offers(
        _home(), _spec(gpu_models=["L4", "A10G"], providers=["aws"]), gpu_count_exact=False
    )
    rows = listing["offers"]
    assert rows and {r["region"] for r in rows} == {"eu-west-1"}
    assert all(r["enabled"] and r["source"] == "catalog" for r in rows)
    assert {r["gpu_name"] for r in rows} == {"A10G"}  # no g6 in eu-west-1
    assert any("live offers unavailable" in n for n in listing["notes"])
    unrestricted = list_offers(_home(), _spec(gpu_models=["L4"]), gpu_count_exact=False)
    assert any("'azur' is not an installed provider" in n for n in unrestricted["notes"])
    assert not any("not enabled" in n and "aws" in n.split(":")[0] for n in listing["notes"])


# --- names offers cannot know are usage errors, not "no offers" -------------------------------


def test_limit_zero_lists_every_offer(no_aws_credentials: None) -> None:
    spec = _spec(providers=["aws"])
    everything = list_offers(_home(), spec, gpu_count_exact=False, limit=0)
    assert everything["total"] > 30 and len(everything["offers"]) == everything["total"]
    assert len(list_offers(_home(), spec, gpu_count_exact=False, limit=3)["offers"]) == 3


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"gpu_models": ["FOO"]},
            r"^resources\.gpu_models: 'FOO' is not a GPU model gpulayer knows",
        ),
        ({"gpu_models": ["A101"]}, r"^resources\.gpu_models: 'A101' .*closest: A10, A10G, A100"),
        ({"gpu_models": ["H10"]}, r"closest: H100"),
        ({"regions": ["mars-1"]}, r"^placement\.regions: 'mars-1' is not a region"),
        ({"regions": ["us-est-1"]}, r"^placement\.regions: 'us-est-1' .*closest: .*us-east-1"),
        ({"providers": ["nope"]}, r"^placement\.providers: 'nope' is not an installed provider"),
    ],
)
def test_unknown_names_are_usage_errors_naming_the_closest(
    no_aws_credentials: None, changes: dict[str, Any], expected: str
) -> None:
    with pytest.raises(UsageError, match=expected):
        list_offers(_home(), _spec(**{"providers": ["aws"], **changes}))


def test_errors_name_the_callers_own_spelling_of_a_field(no_aws_credentials: None) -> None:
    flags = {"gpu_models": "--gpu", "regions": "--region", "providers": "--provider"}
    with pytest.raises(UsageError, match=r"^--gpu: 'FOO'"):
        list_offers(_home(), _spec(gpu_models=["FOO"]), names=flags)
    with pytest.raises(UsageError, match=r"^--region: 'mars-1'"):
        list_offers(_home(), _spec(regions=["mars-1"]), names=flags)
    with pytest.raises(UsageError, match=r"^--provider: 'awss' .*did you mean 'aws'"):
        list_offers(_home(), _spec(providers=["awss"]), names=flags)


def test_known_spellings_still_list(no_aws_credentials: None) -> None:
    for gpu in ("a100", "NVIDIA A100-SXM4-80GB", "A100-80GB", "l40s", "RTX PRO 6000"):
        list_offers(_home(), _spec(gpu_models=[gpu], providers=["aws"]), gpu_count_exact=False)
    listed = list_offers(_home(), _spec(regions=["eu-west-1"], providers=["aws"]), limit=0)
    assert listed["offers"] and {r["region"] for r in listed["offers"]} == {"eu-west-1"}


# --- listed prices are the ones submit would pay ----------------------------------------------


def test_spot_is_listed_only_where_the_provider_allows_it(no_aws_credentials: None) -> None:
    spec = _spec(gpu_models=["A100"], providers=["aws"])
    (_home() / "providers.yaml").write_text("aws:\n  regions: [us-east-1]\n")
    on_demand = list_offers(_home(), spec, gpu_count_exact=False, limit=0)["offers"]
    assert on_demand and not any(r["spot"] for r in on_demand)
    # The cheapest row is what submit rents: the on-demand p4d, not a spot price.
    assert on_demand[0]["instance_type"] == "p4d.24xlarge" and on_demand[0]["hourly_price"] > 20
    (_home() / "providers.yaml").write_text("aws:\n  regions: [us-east-1]\n  allow_spot: true\n")
    both = list_offers(_home(), spec, gpu_count_exact=False, limit=0)["offers"]
    assert any(r["spot"] for r in both) and any(not r["spot"] for r in both)
