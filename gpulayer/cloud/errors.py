"""Typed provider failures. Providers translate their cloud's error codes into these; everything
above the provider (ranking, orchestration) decides on the type and scope, never on a message."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ClassVar, Literal

from gpulayer.errors import GpulayerError, UsageError

Scope = Literal["zone", "region", "provider"]
SCOPES: tuple[Scope, ...] = ("zone", "region", "provider")


class ProviderError(GpulayerError):
    """A provider call failed. ``provider`` names the plugin when known."""

    def __init__(self, message: str, *, provider: str | None = None) -> None:
        super().__init__(f"{provider}: {message}" if provider else message)
        self.provider = provider
        self.message = message


class ScopedProviderError(ProviderError):
    """A failure that says something about a place: later offers in the same zone, region or
    provider would fail the same way, so the caller can skip them (see ``BlockList``)."""

    kind: ClassVar[str] = "error"

    def __init__(
        self,
        scope: Scope,
        provider: str,
        region: str | None,
        zone: str | None,
        message: str,
    ) -> None:
        if scope not in SCOPES:
            raise ValueError(f"scope: {scope!r} is not one of {', '.join(SCOPES)}")
        if scope == "zone" and zone is None:
            # Without a zone the narrowest truthful scope is the region.
            scope = "region"
        if scope == "region" and region is None:
            scope = "provider"
        self.scope: Scope = scope
        self.region = region
        self.zone = zone
        place = {"zone": zone, "region": region, "provider": provider}[scope]
        super().__init__(f"{message} ({scope} {place})", provider=provider)
        self.message = message


class CapacityError(ScopedProviderError):
    """The cloud has no capacity for the offer right now (in a zone, a region, or at all)."""

    kind = "capacity"


class QuotaError(ScopedProviderError):
    """An account limit stops the launch. Limits are per region, so the scope is the region."""

    kind = "quota"

    def __init__(self, provider: str, region: str | None, message: str) -> None:
        super().__init__("region", provider, region, None, message)


class AuthError(ScopedProviderError):
    """Credentials are missing, wrong or lack a permission: nothing at this provider will work."""

    kind = "auth"

    def __init__(self, provider: str, message: str) -> None:
        super().__init__("provider", provider, None, None, message)


class ProvisionTimeout(ProviderError):
    """An instance did not reach the wanted state within the allowed time."""


class ImageNotFoundError(ProviderError):
    """No machine image matches the image release's selector in the wanted region."""

    exit_code = 2


class ProviderNotInstalled(ProviderError, UsageError):
    """No installed distribution registers a provider of that name (or its plugin does not
    import here): a setup problem the caller is told of (the API answers 400), not a fault."""

    exit_code = 2


class ProviderSettingsError(ProviderError, UsageError):
    """A provider's settings do not validate; the message names the field."""

    exit_code = 2


Translator = Callable[..., Exception]


@contextmanager
def translated(
    translate: Translator, region: str | None = None, zone: str | None = None
) -> Iterator[None]:
    """Raise failures inside the block as ``translate`` types them (called with the exception
    and ``region=``/``zone=``); exceptions it returns unchanged pass through as they are."""
    try:
        yield
    except Exception as exc:
        typed = translate(exc, region=region, zone=zone)
        if typed is exc:
            raise
        raise typed from exc
