"""Which AMI a launch uses, from an image release's selector.

A selector is a mapping, one of:

- ``{"ami_id": "ami-0123..."}``: that image (AMI ids differ per region);
- ``{"ami_ids": {"us-east-1": "ami-...", ...}}``: an image per region;
- ``{"owners": ["099720109477"], "name": "ubuntu/images/*-22.04-*-server-*"}``: the newest
  available image of those owners whose name matches the pattern (EC2 wildcards).

Any of them may add ``"ssh_user"``, the image's login user.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpulayer.cloud import ImageNotFoundError, ProviderSettingsError
from gpulayer_aws.errors import PROVIDER, aws_errors

_KEYS = frozenset({"ami_id", "ami_ids", "owners", "name", "ssh_user"})
_EC2_ARCH = {"x86_64": "x86_64", "aarch64": "arm64"}


@dataclass(frozen=True)
class Image:
    ami_id: str
    root_device_name: str | None
    name: str
    ssh_user: str


def newest(images: list[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The image created last; ties (same second) go to the later name, then id."""
    if not images:
        return None
    return max(
        images,
        key=lambda i: (str(i.get("CreationDate", "")), str(i.get("Name", "")), i["ImageId"]),
    )


def _check(selector: Mapping[str, Any]) -> None:
    unknown = sorted(set(selector) - _KEYS)
    if unknown:
        raise ProviderSettingsError(
            f"image.{unknown[0]}: unknown key; use ami_id, ami_ids, or owners and name",
            provider=PROVIDER,
        )
    if not ({"ami_id", "ami_ids"} & set(selector) or "name" in selector):
        raise ProviderSettingsError(
            "image: give ami_id, ami_ids, or owners and a name pattern", provider=PROVIDER
        )


def resolve_image(
    ec2: Any, selector: Mapping[str, Any], *, region: str, cpu_arch: str, default_user: str
) -> Image:
    _check(selector)
    arch = _EC2_ARCH.get(cpu_arch, cpu_arch)
    ami_id = selector.get("ami_id") or dict(selector.get("ami_ids") or {}).get(region)
    with aws_errors(region):
        if ami_id:
            found = ec2.describe_images(
                ImageIds=[ami_id], Filters=[{"Name": "architecture", "Values": [arch]}]
            )["Images"]
            what = f"{ami_id} ({arch})"
        elif selector.get("ami_ids"):
            raise ImageNotFoundError(
                f"the image release has no AMI for {region}", provider=PROVIDER
            )
        else:
            owners = selector.get("owners") or []
            found = ec2.describe_images(
                Owners=list(owners),
                Filters=[
                    {"Name": "name", "Values": [str(selector["name"])]},
                    {"Name": "architecture", "Values": [arch]},
                    {"Name": "state", "Values": ["available"]},
                ],
            )["Images"]
            what = f"{selector['name']!r} ({arch}, owners {', '.join(owners) or 'any'})"
    image = newest(found)
    if image is None:
        raise ImageNotFoundError(f"no AMI matches {what} in {region}", provider=PROVIDER)
    return Image(
        ami_id=image["ImageId"],
        root_device_name=image.get("RootDeviceName"),
        name=str(image.get("Name", "")),
        ssh_user=str(selector.get("ssh_user") or default_user),
    )
