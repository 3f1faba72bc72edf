"""Typed errors shared across gpulayer. The CLI maps them to exit codes and one-line messages."""

from __future__ import annotations


class GpulayerError(Exception):
    """Base of every error gpulayer raises on purpose."""

    exit_code = 1


class UsageError(GpulayerError):
    """Bad input from the user: a flag, an argument or a spec field. Exit code 2."""

    exit_code = 2


class SpecError(UsageError):
    """A JobSpec that does not validate; ``lines`` holds one message per problem."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("; ".join(lines))
        self.lines = lines


class BundleNotKeptError(UsageError):
    """A job named a content-addressed bundle the server does not keep: the submitter
    uploads it and asks again (a bundle sent before costs no upload)."""


class NotFoundError(GpulayerError):
    """A job, worker or artifact that does not exist."""

    exit_code = 2


class ControlPlaneError(GpulayerError):
    """The control plane could not be reached or answered with an error."""


class ForbiddenError(GpulayerError):
    """A known caller asked for something its credential does not reach (HTTP 403)."""

    exit_code = 2


class StaleAttemptError(GpulayerError):
    """A write from an attempt that is no longer its job's current one (HTTP 409).

    The worker that gets it ends that attempt's processes: the job is already elsewhere.
    """
