"""Typed failures of a bootstrap."""

from __future__ import annotations

from collections.abc import Iterable

from gpulayer.errors import GpulayerError, UsageError


class BootstrapError(GpulayerError):
    """The worker could not be set up on the host. ``output_tail`` holds the last lines the
    host printed; nothing the bootstrap started is left running there."""

    def __init__(self, message: str, output_tail: Iterable[str] = ()) -> None:
        self.reason = message
        self.output_tail = tuple(output_tail)
        shown = [line for line in self.output_tail if line.strip()][-8:]
        super().__init__(f"{message}; last output: {' | '.join(shown)}" if shown else message)


class BootstrapTimeout(BootstrapError):
    """The bootstrap did not finish within its time budget."""


class HostIncompatible(BootstrapError):
    """The host's python cannot run the worker: missing, too old, without venv, or not the
    python version and platform the wheelhouse was built for."""


class BootstrapPlanError(UsageError):
    """A bootstrap plan field that cannot be used; the message names the field."""


class RemoteWorkerError(GpulayerError):
    """Stopping or removing a bootstrapped worker failed (the host may be gone)."""
