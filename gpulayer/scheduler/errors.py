"""Errors the scheduler raises on bad input. Each message is one line naming the field."""

from __future__ import annotations

from gpulayer.errors import GpulayerError, NotFoundError, UsageError


class SchedulerError(GpulayerError):
    """Base of the scheduler's errors."""


class InvalidSnapshot(SchedulerError, UsageError):
    """A worker snapshot that contradicts itself, e.g. a free GPU the worker does not have."""


class UnknownWorker(SchedulerError, NotFoundError):
    """A worker id the index does not hold."""


class DuplicateWorker(SchedulerError, UsageError):
    """A worker id added to an index twice."""


class UnknownStrategy(SchedulerError, UsageError):
    """A strategy name no ranking exists for."""
