"""The one place where EC2 error codes become gpulayer's typed errors."""

from __future__ import annotations

from contextlib import AbstractContextManager

from gpulayer.cloud import (
    AuthError,
    CapacityError,
    ImageNotFoundError,
    ProviderError,
    QuotaError,
    translated,
)

PROVIDER = "aws"

# No capacity for this instance type where we asked; elsewhere may have some.
ZONE_CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientCapacity",
        "InsufficientFreeAddressesInSubnet",
        "Unsupported",
        "SpotMaxPriceTooLow",
    }
)
# Account limits are per region.
QUOTA_CODES = frozenset(
    {
        "VcpuLimitExceeded",
        "InstanceLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "VolumeLimitExceeded",
        "SecurityGroupLimitExceeded",
        "KeyPairLimitExceeded",
    }
)
# Credentials rejected or lacking a permission: nothing at AWS will work.
AUTH_CODES = frozenset(
    {
        "AuthFailure",
        "UnauthorizedOperation",
        "AccessDenied",
        "AccessDeniedException",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "RequestExpired",
    }
)
IMAGE_CODES = frozenset(
    {"InvalidAMIID.NotFound", "InvalidAMIID.Malformed", "InvalidAMIID.Unavailable"}
)
# Codes that mean "already gone", which teardown treats as done.
NOT_FOUND_CODES = frozenset(
    {
        "InvalidInstanceID.NotFound",
        "InvalidKeyPair.NotFound",
        "InvalidGroup.NotFound",
        "InvalidGroupId.NotFound",
    }
)


def error_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return str(code) if code else None
    return None


def _message(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        message = response.get("Error", {}).get("Message")
        if message:
            return " ".join(str(message).split())
    return " ".join(str(exc).split())


def translate(exc: Exception, *, region: str | None = None, zone: str | None = None) -> Exception:
    """The typed error for a botocore failure, or ``exc`` itself when it is not one."""
    from botocore import exceptions as bx

    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError):
        return AuthError(
            PROVIDER,
            "no AWS credentials found; set AWS_PROFILE or AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY where you submit, or configure ~/.aws/credentials",
        )
    if isinstance(exc, bx.ProfileNotFound):
        return AuthError(PROVIDER, f"AWS profile not found: {_message(exc)}")
    if isinstance(exc, bx.ClientError):
        code = error_code(exc) or "Unknown"
        text = f"{code}: {_message(exc)}"
        if code in ZONE_CAPACITY_CODES:
            return CapacityError("zone", PROVIDER, region, zone, text)
        if code in QUOTA_CODES:
            return QuotaError(PROVIDER, region, text)
        if code in AUTH_CODES:
            return AuthError(PROVIDER, f"credentials rejected ({text})")
        if code in IMAGE_CODES:
            return ImageNotFoundError(text, provider=PROVIDER)
        return ProviderError(text, provider=PROVIDER)
    if isinstance(exc, bx.EndpointConnectionError | bx.ConnectTimeoutError):
        return ProviderError(f"cannot reach AWS: {_message(exc)}", provider=PROVIDER)
    if isinstance(exc, bx.WaiterError):
        return ProviderError(f"waiting failed: {_message(exc)}", provider=PROVIDER)
    if isinstance(exc, bx.BotoCoreError):
        return ProviderError(_message(exc), provider=PROVIDER)
    return exc


def aws_errors(region: str | None = None, zone: str | None = None) -> AbstractContextManager[None]:
    """Raise botocore failures inside the block as typed errors scoped to ``region``/``zone``."""
    return translated(translate, region, zone)


def is_not_found(exc: BaseException) -> bool:
    cause = exc.__cause__ if isinstance(exc, ProviderError) else exc
    return error_code(cause) in NOT_FOUND_CODES if cause is not None else False
