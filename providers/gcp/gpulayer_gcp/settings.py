"""What the GCP provider is told: which project, where to look, how to network instances.

Credentials are not settings: google-auth's default chain finds them
(GOOGLE_APPLICATION_CREDENTIALS, ``gcloud auth application-default login``, the metadata
server of a GCE machine), or
``credentials_file`` names a service-account or ADC file. No secret passes through gpulayer's
configuration.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpulayer.cloud import InstallRootSetting, PythonSetting

_REGION_RE = re.compile(r"^[a-z]+-[a-z]+\d+$")
_ZONE_RE = re.compile(r"^([a-z]+-[a-z]+\d+)-[a-z]+\d*$")
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_IMAGE_KEYS = frozenset({"project", "family", "image", "ssh_user"})


def zone_region(zone: str) -> str:
    """us-central1-a -> us-central1."""
    match = _ZONE_RE.match(zone)
    if not match:
        raise ValueError(f"{zone!r} is not a GCE zone name such as us-central1-a")
    return match.group(1)


class GcpSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    project: str | None = None
    """The project instances are rented in; None: the credentials' project."""
    regions: Annotated[list[str], Field(min_length=1)] = ["us-central1"]
    """Regions offers are looked for in, e.g. us-central1."""
    zones: list[str] = Field(default_factory=list)
    """Only these zones (each in one of ``regions``); empty: every zone of the regions."""
    network: str = "default"
    """The VPC network instances join (its name, or a projects/.../global/networks/... link)."""
    subnetwork: str | None = None
    """A subnetwork of ``network`` (name or link), for custom-mode networks; None: the network's
    automatic subnetwork of the region."""
    allow_spot: bool = False
    """Offer spot capacity (provisioningModel SPOT, deleted on preemption) besides on-demand."""
    image: dict[str, Any] = Field(default_factory=dict)
    """An image override that wins over the job's image release: ``{"project": ..., "family":
    ...}`` (the family's newest image) or ``{"image": "projects/P/global/images/NAME"}``,
    either with an optional ``ssh_user``."""
    credentials_file: Path | None = None
    """A service-account key or ADC file; None: google-auth's default chain."""
    endpoint_url: str | None = None
    """Send every Compute API call here instead of Google (a local test server)."""
    offers_source: Literal["api", "catalog"] = "api"
    """api: machine and accelerator types per zone from the Compute API (cached), priced by
    the catalog; catalog: the shipped catalog alone, no API call and no credentials."""
    use_private_ip: bool = False
    """Reach instances on their internal address (controller inside the VPC or on a VPN);
    instances then get no external address."""
    ssh_user: str = "gpulayer"
    """Login user, whose key goes into the instance's metadata, when the image names none."""
    disk_type: str = "pd-balanced"
    """The boot disk's type (pd-balanced, pd-ssd, pd-standard, hyperdisk-balanced)."""
    python: PythonSetting = None
    """The python the worker bootstrap runs on instances; None: ``python3``."""
    install_root: InstallRootSetting = None
    """Where workers are installed on instances, one directory per job below it; None: the
    orchestrator's default, /var/tmp/gpulayer."""
    cache_dir: Path | None = None
    """Where fetched catalog data is kept; None: $GPULAYER_HOME/cache/gcp."""
    catalog_ttl_seconds: Annotated[float, Field(ge=0)] = 86_400
    """How long machine and accelerator types per zone are reused."""
    operation_timeout_seconds: Annotated[float, Field(gt=0)] = 600
    """How long an insert or delete operation is waited for."""

    @field_validator("regions")
    @classmethod
    def _region_names(cls, regions: list[str]) -> list[str]:
        for region in regions:
            if not _REGION_RE.match(region):
                raise ValueError(f"{region!r} is not a GCE region name such as us-central1")
        return list(dict.fromkeys(regions))

    @field_validator("zones")
    @classmethod
    def _zone_names(cls, zones: list[str]) -> list[str]:
        for zone in zones:
            zone_region(zone)
        return list(dict.fromkeys(zones))

    @field_validator("project")
    @classmethod
    def _project(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^[a-z][-a-z0-9.:]{4,61}[a-z0-9]$", value):
            raise ValueError(f"{value!r} is not a GCP project id")
        return value

    @field_validator("ssh_user")
    @classmethod
    def _ssh_user(cls, value: str) -> str:
        if not re.match(r"^[a-z_][a-z0-9_-]{0,31}$", value):
            raise ValueError(f"{value!r} is not a login name")
        return value

    @field_validator("image")
    @classmethod
    def _image(cls, value: dict[str, Any]) -> dict[str, Any]:
        if not value:
            return value
        unknown = sorted(set(value) - _IMAGE_KEYS)
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r}; use project and family, or image")
        if not ("image" in value or {"project", "family"} <= set(value)):
            raise ValueError("give project and family, or image")
        return value

    @model_validator(mode="after")
    def _zones_in_regions(self) -> GcpSettings:
        for zone in self.zones:
            if zone_region(zone) not in self.regions:
                raise ValueError(
                    f"zones: {zone} is not in one of regions ({', '.join(self.regions)})"
                )
        return self

    def allowed_zones(self, region: str, zones: list[str]) -> list[str]:
        if not self.zones:
            return zones
        return [z for z in zones if z in self.zones]

    def default_cache_dir(self) -> Path:
        from gpulayer.cloud import default_cache_dir

        return self.cache_dir or default_cache_dir("gcp")


def resource_name(request_id: str) -> str:
    """The instance and firewall rule of one launch request: GCE names are lower-case letters,
    digits and dashes, starting with a letter, at most 63 long."""
    cleaned = re.sub(r"[^a-z0-9-]+", "-", request_id.lower()).strip("-")
    name = f"gpulayer-{cleaned}"[:63].rstrip("-")
    if not _NAME_RE.match(name):
        raise ValueError(f"request id {request_id!r} gives no valid GCE name")
    return name
