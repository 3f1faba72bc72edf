"""What a step's I/O found, read as data: the step calls the provider and hands what came back
(an exception included) to these pure functions, which say what it means for the instance: the
move a failed launch makes and the outcome its try records, whether a machine the provider no
longer shows was reclaimed or lost, and how long a reclaimed machine's job may go on saving its
work. As Ray's autoscaler keeps a launch's error as data, none of this is decided inside a
step's ``except``; the property and example tests drive it without a provider."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from gpulayer.cloud.errors import ScopedProviderError
from gpulayer.cloud.lifecycle import planning
from gpulayer.errors import UsageError

if TYPE_CHECKING:
    from gpulayer.cloud.protocol import Instance

RECLAIM_UPLOAD_MARGIN_SECONDS = 30.0
"""Past a reclaimed job's grace: time for its worker to upload what it wrote and report."""


@dataclass(frozen=True)
class LaunchFailed:
    """A launch call that did not give the machine(s)."""

    to: Literal["never_launched", "terminating"]
    """never_launched: the provider said it created nothing; terminating: it may have, and
    the terminate looks it up by its request tag."""
    reason: str
    """As recorded with the move."""
    end: planning.TryEnd
    """What the try ended in (node 0's record carries it for a gang)."""
    then: str
    """What follows, for the job's log: `trying the next offer`, ..."""
    config: bool = False
    """Refused for its configuration: counted per provider (see :func:`after_config_error`)."""


def launch_failed(exc: Exception) -> LaunchFailed:
    if isinstance(exc, ScopedProviderError):
        # A refusal: the provider says it created nothing, so nothing is to be torn down.
        return LaunchFailed(
            "never_launched",
            f"{exc.kind}: {exc}",
            planning.refused(exc.kind, exc.scope, exc.message),
            f"blocking that {exc.scope} and moving on",
        )
    if isinstance(exc, UsageError):  # ProviderSettingsError, an image release missing, ...
        # Refused before any call that creates: nothing to tear down.
        return LaunchFailed(
            "never_launched",
            f"configuration error: {exc}",
            planning.misconfigured(str(exc)),
            "trying the next offer",
            config=True,
        )
    return LaunchFailed(
        "terminating", f"launch failed: {exc}", planning.failed(str(exc)), "trying the next offer"
    )


def after_config_error(provider: str, config_tries: int) -> str:
    """What follows a configuration error, given the provider's tries for the job that ended
    so (this one included)."""
    if config_tries >= planning.CONFIG_TRIES_PER_PROVIDER:
        return f"not trying {provider} again"
    return "trying the next offer"


MachineFate = Literal["there", "reclaimed", "lost"]


def machine_fate(described: Instance | None, outcome: str | None) -> MachineFate:
    """What the provider's answer says of a machine a worker runs on: still there, taken back
    (reclaimed: not shown at all, shown as reclaimed, or seen reclaimed before, since a provider
    may later show it as merely ended, as Slurm forgets a PREEMPTED job after MinJobAge), or
    lost some other way."""
    if described is not None and described.live:
        return "there"
    if described is None or described.reclaimed or outcome == "reclaimed":
        return "reclaimed"
    return "lost"


def still_saving(
    reclaimed_at: float | None, now: float, grace_seconds: float, *, worker_answers: bool
) -> bool:
    """A machine reclaimed under a running job shuts down: its worker gives the job its grace
    and uploads what it wrote before it goes. While the worker still answers, its report is
    waited for that long from when the reclaim was first seen (and a margin for the upload);
    a worker gone silent ends the wait."""
    if not worker_answers:
        return False
    since = now if reclaimed_at is None else reclaimed_at
    return now - since < grace_seconds + RECLAIM_UPLOAD_MARGIN_SECONDS
