"""gpulayer's Google Compute Engine provider. Importing this package does not import
google.cloud.compute_v1 (about two seconds); the first API call does."""

from gpulayer_gcp.billing import refresh_catalog
from gpulayer_gcp.provider import GcpProvider
from gpulayer_gcp.settings import GcpSettings

__all__ = ["GcpProvider", "GcpSettings", "refresh_catalog"]
