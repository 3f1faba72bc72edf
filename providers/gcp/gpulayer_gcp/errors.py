"""The one place where Compute Engine errors become gpulayer's typed errors.

Errors come two ways: an HTTP error answer to a call (google.api_core exceptions, carrying the
API's ``errors[].reason``), and an operation that ends with ``error.errors[].code`` (an insert
accepted at once, then failed for lack of capacity or quota).
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Any

from gpulayer.cloud import (
    AuthError,
    CapacityError,
    ImageNotFoundError,
    ProviderError,
    QuotaError,
    translated,
)

PROVIDER = "gcp"

# No capacity for this machine where we asked; another zone may have some.
CAPACITY_CODES = frozenset(
    {
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "RESOURCE_POOL_EXHAUSTED",
        "STOCKOUT",
        "resourcePoolExhausted",
    }
)
CAPACITY_MESSAGES = ("does not have enough resources", "resource pool exhausted")
# Project quotas are per region (CPUS, NVIDIA_T4_GPUS, PREEMPTIBLE_NVIDIA_A100_GPUS, ...).
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED", "quotaExceeded", "QUOTA_LIMIT_EXCEEDED"})
# A 403 that is not a quota: the credentials lack a permission or the API is off.
PERMISSION_REASONS = frozenset(
    {
        "forbidden",
        "insufficientPermissions",
        "accessNotConfigured",
        "SERVICE_DISABLED",
        "IAM_PERMISSION_DENIED",
        "authError",
    }
)
NOT_FOUND_CODES = frozenset({"RESOURCE_NOT_FOUND", "notFound"})


def http_reasons(exc: BaseException) -> list[str]:
    """The ``errors[].reason`` values of an HTTP error answer, plus its ErrorInfo reason."""
    reasons = []
    for item in getattr(exc, "errors", None) or ():
        if isinstance(item, dict) and item.get("reason"):
            reasons.append(str(item["reason"]))
    reason = getattr(exc, "reason", None)
    if reason:
        reasons.append(str(reason))
    return reasons


def _message(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc)
    return " ".join(str(text).split())


def classify(
    codes: Iterable[str], message: str, *, region: str | None, zone: str | None
) -> ProviderError | None:
    """The typed error for Compute error codes (or reasons) and their message; None when they
    say nothing gpulayer acts on."""
    found = set(codes)
    text = f"{', '.join(sorted(found)) or 'error'}: {message}"
    lowered = message.lower()
    if found & CAPACITY_CODES or any(m in lowered for m in CAPACITY_MESSAGES):
        return CapacityError("zone", PROVIDER, region, zone, text)
    if found & QUOTA_CODES:
        return QuotaError(PROVIDER, region, text)
    return None


def translate(exc: Exception, *, region: str | None = None, zone: str | None = None) -> Exception:
    """The typed error for a google-auth or google-api-core failure, else ``exc`` itself."""
    if isinstance(exc, ProviderError):
        return exc
    from google.api_core import exceptions as gx
    from google.auth import exceptions as ax

    if isinstance(exc, ax.DefaultCredentialsError):
        return AuthError(
            PROVIDER,
            "no Google Cloud credentials found; run `gcloud auth application-default login`, "
            "set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, or set "
            "credentials_file",
        )
    if isinstance(exc, ax.RefreshError):
        return AuthError(PROVIDER, f"credentials rejected ({_message(exc)})")
    if isinstance(exc, ax.TransportError):
        return ProviderError(f"cannot reach Google: {_message(exc)}", provider=PROVIDER)
    if isinstance(exc, gx.GoogleAPICallError):
        reasons = http_reasons(exc)
        message = _message(exc)
        typed = classify(reasons, message, region=region, zone=zone)
        if typed is not None:
            return typed
        if isinstance(exc, gx.Unauthorized):
            return AuthError(PROVIDER, f"credentials rejected ({message})")
        denied = not reasons or set(reasons) & PERMISSION_REASONS
        if isinstance(exc, gx.Forbidden | gx.PermissionDenied) and denied:
            return AuthError(PROVIDER, f"permission denied ({message})")
        if isinstance(exc, gx.ServiceUnavailable):
            return CapacityError("zone", PROVIDER, region, zone, message)
        return ProviderError(message, provider=PROVIDER)
    if isinstance(exc, gx.RetryError | gx.GoogleAPIError):
        return ProviderError(_message(exc), provider=PROVIDER)
    return exc


def gcp_errors(region: str | None = None, zone: str | None = None) -> AbstractContextManager[None]:
    """Raise Google client failures inside the block as typed errors scoped to the place."""
    return translated(translate, region, zone)


def is_not_found(exc: BaseException) -> bool:
    from google.api_core import exceptions as gx

    cause = exc.__cause__ if isinstance(exc, ProviderError) else exc
    return isinstance(cause, gx.NotFound)


def is_conflict(exc: BaseException) -> bool:
    from google.api_core import exceptions as gx

    return isinstance(exc, gx.Conflict)


def operation_error(
    operation: Any, *, region: str | None, zone: str | None, what: str
) -> ProviderError | None:
    """The typed error of a finished operation that failed; None when it succeeded."""
    error = getattr(operation, "error", None)
    items = list(getattr(error, "errors", None) or ()) if error is not None else []
    if not items:
        return None
    codes = [str(getattr(i, "code", "") or "") for i in items]
    message = "; ".join(str(getattr(i, "message", "") or "") for i in items)
    typed = classify(codes, message, region=region, zone=zone)
    if typed is not None:
        return typed
    if set(codes) & NOT_FOUND_CODES and what == "image":
        return ImageNotFoundError(message, provider=PROVIDER)
    return ProviderError(f"{what} failed: {', '.join(codes)}: {message}", provider=PROVIDER)
