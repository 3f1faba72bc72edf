"""Typed failures of building or reading a wheelhouse."""

from __future__ import annotations

from gpulayer.errors import GpulayerError


class WheelhouseError(GpulayerError):
    """The wheelhouse cannot be built or read."""


class DistributionNotRepackable(WheelhouseError):
    """An installed distribution lacks what a wheel is made from (RECORD, WHEEL) or a file its
    RECORD lists."""
