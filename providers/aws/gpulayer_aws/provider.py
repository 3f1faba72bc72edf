"""The AWS provider: gpulayer's five provider verbs on Amazon EC2."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpulayer.cloud import (
    CatalogInfo,
    CatalogProvider,
    CatalogRefresher,
    CredentialSources,
    DiskCache,
    GangProvider,
    Instance,
    LaunchRequest,
    NamesRegions,
    Offer,
    OfferQuery,
    ProviderError,
    ReadsCredentials,
    load_settings,
)
from gpulayer_aws import catalog
from gpulayer_aws.errors import PROVIDER, aws_errors
from gpulayer_aws.instances import by_ids, live_by_tags, to_instance
from gpulayer_aws.launch import launch, launch_instances
from gpulayer_aws.offers import OfferSource, catalog_offers
from gpulayer_aws.session import Clients, credential_sources
from gpulayer_aws.settings import AwsSettings
from gpulayer_aws.terminate import terminate_in_region


class AwsProvider(GangProvider, CatalogProvider, CatalogRefresher, NamesRegions, ReadsCredentials):
    """Amazon EC2. Settings: see :class:`gpulayer_aws.settings.AwsSettings`."""

    settings_model = AwsSettings
    """What providers.yaml's section for this provider is validated into."""

    name = PROVIDER

    def __init__(self, settings: AwsSettings | Mapping[str, Any] | None = None) -> None:
        self.settings = load_settings(AwsSettings, settings, provider=PROVIDER)
        self._clients = Clients(self.settings)
        self._source = OfferSource(
            self.settings, self._clients, DiskCache(self.settings.default_cache_dir())
        )
        # Instance ids do not say their region; remember the ones seen to ask one region.
        self._region_of: dict[str, str] = {}
        self._lock = threading.Lock()

    def offers(self, query: OfferQuery) -> list[Offer]:
        return self._source.offers(query)

    def launch(self, offer: Offer, request: LaunchRequest) -> Instance:
        instance = launch(self._clients.ec2(offer.region), self.settings, offer, request)
        self._remember([instance])
        return instance

    def launch_gang(self, offer: Offer, request: LaunchRequest) -> list[Instance]:
        """The gang's N instances from one run_instances (MinCount = MaxCount = N)."""
        instances = launch_instances(self._clients.ec2(offer.region), self.settings, offer, request)
        self._remember(instances)
        return instances

    def describe(self, ids: Sequence[str]) -> list[Instance]:
        found = {i.id: i for i in self._describe(ids)}
        return [found[i] for i in dict.fromkeys(ids) if i in found]

    def terminate(self, ids: Sequence[str]) -> None:
        for region, raws in self._locate(ids).items():
            terminate_in_region(self._clients.ec2(region), self.settings, region, raws)

    def list_owned(self, tags: Mapping[str, str]) -> list[Instance]:
        if not tags:
            # Without a tag every instance of the account would match, and a reaper ends them.
            raise ProviderError("list_owned needs at least one tag to match", provider=PROVIDER)
        instances = []
        for region in self.settings.regions:
            with aws_errors(region):
                raws = live_by_tags(self._clients.ec2(region), tags)
            instances += [self._instance(raw, region) for raw in raws]
        self._remember(instances)
        return instances

    # --- abilities --------------------------------------------------------------------------

    def configured_regions(self) -> list[str]:
        return list(self.settings.regions)

    def credential_sources(self, environ: Mapping[str, str]) -> CredentialSources:
        return credential_sources(environ)

    # --- the catalog: offers without credentials or network ---------------------------------

    def catalog_offers(self, query: OfferQuery, *, everywhere: bool = False) -> list[Offer]:
        """Offers from the catalog alone, spot among them only when ``allow_spot`` (what a
        launch would rent); ``everywhere``: every region it prices, else the configured
        regions."""
        found = catalog.load_catalog(self.settings.default_cache_dir())
        return catalog_offers(
            found,
            query,
            regions=None if everywhere else self.settings.regions,
            allow_spot=self.settings.allow_spot,
        )

    def catalog_info(self) -> CatalogInfo:
        return catalog.load_catalog(self.settings.default_cache_dir()).info()

    def refresh_catalog(
        self,
        regions: Iterable[str] | None = None,
        *,
        source: catalog.PriceSource = "api",
        on_region: Callable[[str], None] | None = None,
        wait_seconds: float | None = None,
    ) -> Path:
        """Rebuild the catalog from the public bulk price list or the Pricing API (see
        :func:`gpulayer_aws.catalog.refresh_catalog`)."""
        return catalog.refresh_catalog(
            self.settings,
            regions=regions,
            source=source,
            on_region=on_region,
            wait_seconds=wait_seconds,
        )

    # --- helpers --------------------------------------------------------------------------

    def _instance(self, raw: Mapping[str, Any], region: str) -> Instance:
        return to_instance(
            raw,
            region,
            use_private_ip=self.settings.use_private_ip,
            ssh_user=self.settings.ssh_user,
        )

    def _describe(self, ids: Sequence[str]) -> list[Instance]:
        instances = [
            self._instance(raw, region)
            for region, raws in self._locate(ids).items()
            for raw in raws
        ]
        self._remember(instances)
        return instances

    def _remember(self, instances: Iterable[Instance]) -> None:
        with self._lock:
            for instance in instances:
                self._region_of[instance.id] = instance.region

    def _locate(self, ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """Raw descriptions of ``ids`` by region, asking regions where an id was seen first."""
        pending = list(dict.fromkeys(ids))
        with self._lock:
            seen_in = [self._region_of[i] for i in pending if i in self._region_of]
        found: dict[str, list[dict[str, Any]]] = {}
        for region in dict.fromkeys([*seen_in, *self.settings.regions]):
            if not pending:
                break
            with aws_errors(region):
                raws = by_ids(self._clients.ec2(region), pending)
            if raws:
                found[region] = raws
                located = {r["InstanceId"] for r in raws}
                pending = [i for i in pending if i not in located]
        return found
