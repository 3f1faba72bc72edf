"""The GCP provider: gpulayer's five provider verbs on Google Compute Engine."""

from __future__ import annotations

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
from gpulayer_gcp.errors import PROVIDER, gcp_errors, is_not_found
from gpulayer_gcp.instances import (
    gone_instance,
    label_filter,
    split_id,
    to_instance,
    to_labels,
)
from gpulayer_gcp.launch import launch, launch_gang
from gpulayer_gcp.offers import OfferSource
from gpulayer_gcp.session import Clients, credential_sources
from gpulayer_gcp.settings import GcpSettings, zone_region
from gpulayer_gcp.terminate import terminate_one, was_preempted


class GcpProvider(GangProvider, CatalogProvider, CatalogRefresher, NamesRegions, ReadsCredentials):
    """Google Compute Engine. Settings: see :class:`gpulayer_gcp.settings.GcpSettings`."""

    settings_model = GcpSettings

    name = PROVIDER

    def __init__(self, settings: GcpSettings | Mapping[str, Any] | None = None) -> None:
        self.settings = load_settings(GcpSettings, settings, provider=PROVIDER)
        self._clients = Clients(self.settings)
        self._source = OfferSource(
            self.settings, self._clients, DiskCache(self.settings.default_cache_dir())
        )

    def offers(self, query: OfferQuery) -> list[Offer]:
        return self._source.offers(query)

    def catalog_offers(self, query: OfferQuery, *, everywhere: bool = False) -> list[Offer]:
        """Offers from the price catalog alone: no API call, no credentials needed.
        ``everywhere``: every region the catalog prices, else the configured regions; spot
        only when ``allow_spot`` (what a launch would rent)."""
        return self._source.offers(query, catalog_only=True, everywhere=everywhere)

    def catalog_info(self) -> CatalogInfo:
        found = self._source.catalog()
        return CatalogInfo(
            provider=PROVIDER,
            as_of=found.as_of,
            source=found.source,
            path=str(found.path) if found.path else None,
        )

    def launch(self, offer: Offer, request: LaunchRequest) -> Instance:
        return launch(self._clients, self.settings, self._source.catalog(), offer, request)

    def launch_gang(self, offer: Offer, request: LaunchRequest) -> list[Instance]:
        """The gang's nodes in one zone, all or none (see gpulayer_gcp.launch.launch_gang)."""
        return launch_gang(self._clients, self.settings, self._source.catalog(), offer, request)

    def describe(self, ids: Sequence[str]) -> list[Instance]:
        found = []
        for value in dict.fromkeys(ids):
            zone, name = split_id(value)
            with gcp_errors(zone_region(zone), zone):
                try:
                    raw = self._clients.instances().get(
                        project=self._clients.project, zone=zone, instance=name
                    )
                except Exception as exc:
                    if not is_not_found(exc):
                        raise
                    raw = None
            if raw is not None:
                instance = self._instance(raw)
                if instance.state == "stopping" and was_preempted(self._clients, zone, name):
                    instance = instance.model_copy(update={"reclaimed": True})
                found.append(instance)
            elif was_preempted(self._clients, zone, name):
                # Spot instances are deleted on preemption: only the operation tells.
                found.append(gone_instance(value, preempted=True, ssh_user=self.settings.ssh_user))
        return found

    def terminate(self, ids: Sequence[str]) -> None:
        for value in dict.fromkeys(ids):
            terminate_one(self._clients, self.settings, value)

    def list_owned(self, tags: Mapping[str, str]) -> list[Instance]:
        if not tags:
            # Without a label every instance of the project would match, and a reaper ends them.
            raise ProviderError("list_owned needs at least one tag to match", provider=PROVIDER)
        from google.cloud import compute_v1

        wanted = to_labels(tags)
        instances = []
        with gcp_errors():
            pages = self._clients.instances().aggregated_list(
                request=compute_v1.AggregatedListInstancesRequest(
                    project=self._clients.project,
                    filter=label_filter(tags),
                )
            )
            for _, listed in pages:
                for raw in listed.instances:
                    labels = dict(raw.labels)
                    if all(labels.get(k) == v for k, v in wanted.items()):
                        instances.append(self._instance(raw))
        return [i for i in instances if i.state != "terminated"]

    def configured_regions(self) -> list[str]:
        return list(self.settings.regions)

    def credential_sources(self, environ: Mapping[str, str]) -> CredentialSources:
        return credential_sources(self.settings, environ)

    def refresh_catalog(
        self,
        regions: Iterable[str] | None = None,
        *,
        source: str = "api",
        on_region: Callable[[str], None] | None = None,
        wait_seconds: float | None = None,
    ) -> Path:
        """Reprice the catalog from the Cloud Billing Catalog API (see
        :func:`gpulayer_gcp.billing.refresh_catalog`). GCP publishes its prices through that
        API only, so every ``source`` reads it."""
        if on_region is not None:
            on_region(", ".join(regions or self.settings.regions))
        from gpulayer_gcp.billing import refresh_catalog

        return refresh_catalog(self.settings, regions=regions, wait_seconds=wait_seconds)

    def _instance(self, raw: Any) -> Instance:
        return to_instance(
            raw, use_private_ip=self.settings.use_private_ip, ssh_user=self.settings.ssh_user
        )
