"""What the AWS provider is told: where to look, how to network instances, where to cache.

Credentials are not settings: boto3's default chain finds them (environment, shared files,
``profile``, instance role), so no secret passes through gpulayer's configuration.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpulayer.cloud import InstallRootSetting, PythonSetting

_REGION_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")


class AwsSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    regions: Annotated[list[str], Field(min_length=1)] = ["us-east-1"]
    """Regions whose offers are listed and launched in, e.g. [us-east-1, eu-west-1]."""
    profile: str | None = None
    """A profile of the shared AWS config files; None uses boto3's default chain."""
    endpoint_url: str | None = None
    """Send every API call here instead of AWS (a local test server)."""
    vpc_id: str | None = None
    """Launch into this VPC's subnets (the first one of each zone, unless ``subnet_ids``
    names one); None: the default VPC."""
    subnet_ids: dict[str, str] = Field(default_factory=dict)
    """Availability zone -> subnet to launch into. When set, only these zones are offered."""
    use_private_ip: bool = False
    """Reach instances on their private address (controller inside the VPC or on a VPN);
    instances then get no public address."""
    allow_spot: bool = False
    """Offer spot capacity besides on-demand."""
    price_source: Literal["api", "catalog"] = "api"
    """api: the Pricing API (cached, falling back to the catalog when it fails);
    catalog: only the catalog shipped with the plugin or refreshed by refresh_catalog."""
    price_list_url: str = "https://pricing.us-east-1.amazonaws.com"
    """Where ``gpulayer catalog refresh aws --source bulk`` reads AWS's public bulk price list
    (no credentials needed)."""
    cache_dir: Path | None = None
    """Where fetched catalog data is kept; None: $GPULAYER_HOME/cache/aws."""
    catalog_ttl_seconds: Annotated[float, Field(ge=0)] = 86_400
    """How long instance types, zones and on-demand prices are reused."""
    spot_price_ttl_seconds: Annotated[float, Field(ge=0)] = 900
    """How long spot prices are reused (they move faster than on-demand ones)."""
    image: dict[str, Any] = Field(default_factory=dict)
    """The image instances boot: {ami_id: ...}, {ami_ids: {region: ami}}, or {owners: [...],
    name: pattern} for the newest match; may add ssh_user. Set, it wins over the newest image
    release's AMI (a release the job names wins over it); empty: that release's."""
    ssh_user: str = "ubuntu"
    """Login user when the image selector names none."""
    python: PythonSetting = None
    """The python the worker bootstrap runs on instances, for images whose ``python3`` on the
    login PATH is not the one to use (e.g. /opt/conda/bin/python3); None: ``python3``."""
    install_root: InstallRootSetting = None
    """Where workers are installed on instances, one directory per job below it (e.g. a
    larger data disk); None: the orchestrator's default, /var/tmp/gpulayer."""
    poll_seconds: Annotated[float, Field(gt=0)] = 5
    """How often launch and terminate poll an instance's state."""
    terminate_timeout_seconds: Annotated[float, Field(gt=0)] = 600
    """How long teardown waits for EC2 to confirm an instance is terminated."""
    max_attempts: Annotated[int, Field(ge=1, le=20)] = 4
    """Tries per API call on throttling and transient errors (botocore standard retries)."""

    @field_validator("regions")
    @classmethod
    def _region_names(cls, regions: list[str]) -> list[str]:
        for region in regions:
            if not _REGION_RE.match(region):
                raise ValueError(f"{region!r} is not an AWS region name such as us-east-1")
        return list(dict.fromkeys(regions))

    def default_cache_dir(self) -> Path:
        from gpulayer.cloud import default_cache_dir

        return self.cache_dir or default_cache_dir("aws")
