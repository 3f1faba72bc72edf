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
from gpulayer.cloud.lifecycle.step_result import StepError
from gpulayer.errors import UsageError

if TYPE_CHECKING:
    from gpulayer.cloud.protocol import Instance, JobKeyFile

KEY_REFUSED = "key_refused"
"""A StepError's kind: a host that answered SSH kept refusing the job's key."""

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


def error_of(exc: BaseException) -> StepError:
    """An exception as data: what the readings below (and the stored step result) need."""
    if isinstance(exc, ScopedProviderError):
        return StepError(type(exc).__name__, str(exc), exc.kind, exc.scope, exc.message)
    if isinstance(exc, UsageError):  # ProviderSettingsError, an image release missing, ...
        return StepError(type(exc).__name__, str(exc), "config")
    from gpulayer.ssh.errors import SshKeyRefused

    if isinstance(exc, SshKeyRefused):
        return StepError(type(exc).__name__, str(exc), KEY_REFUSED)
    return StepError(type(exc).__name__, str(exc))


def launch_failed(exc: Exception) -> LaunchFailed:
    return failed_launch(error_of(exc))


def failed_launch(error: StepError) -> LaunchFailed:
    """What a launch that raised ``error`` means: the move, the try's end, what follows."""
    if error.scope is not None:
        # A refusal: the provider says it created nothing, so nothing is to be torn down.
        return LaunchFailed(
            "never_launched",
            f"{error.kind}: {error.text}",
            planning.refused(error.kind, error.scope, error.message or error.text),  # type: ignore[arg-type]
            f"blocking that {error.scope} and moving on",
        )
    if error.kind == "config":
        # Refused before any call that creates: nothing to tear down.
        return LaunchFailed(
            "never_launched",
            f"configuration error: {error.text}",
            planning.misconfigured(error.text),
            "trying the next offer",
            config=True,
        )
    return LaunchFailed(
        "terminating",
        f"launch failed: {error.text}",
        planning.failed(error.text),
        "trying the next offer",
    )


@dataclass(frozen=True)
class PrepareFailed:
    """A machine that could not be made a worker (SSH never answered, the bootstrap failed)."""

    reason: str
    """As recorded with its move to draining."""
    end: planning.TryEnd
    note: str
    """For the job's log."""
    charge_ends: bool = False
    """The machine was never usable: its ledger ends now, not when its teardown is done."""


def key_refused_line(key_file: JobKeyFile | None) -> str:
    """The one line a refused job key gets, naming the setting to change."""
    if key_file is None:
        return "the host refused the job key; set the file its sshd reads"
    return (
        f"{key_file.setting}: the host refused the job key written to {key_file.path}; "
        "set the file its sshd reads"
    )


def prepare_failed(
    error: StepError,
    *,
    in_gang: bool,
    node_rank: int,
    label: str,
    place: str | None,
    key_file: JobKeyFile | None = None,
) -> PrepareFailed:
    """One node of a gang failing is a partial launch: every node goes, and the gang's zone
    is not tried again for the job; a lone machine's offer counts as failed. A refused job
    key is a configuration error (the same on every try): its offer is dropped, it counts
    against the provider's configuration tries, and nothing is charged past the refusal."""
    if error.kind == KEY_REFUSED:
        line = key_refused_line(key_file)
        then = (
            f"tearing the whole gang down (node {node_rank})" if in_gang else "dropping the offer"
        )
        return PrepareFailed(
            f"could not be made a worker: {line}",
            planning.misconfigured(line),
            f"{label}: {line}; {then}",
            charge_ends=True,
        )
    reason = f"could not be made a worker: {error.text}"
    if in_gang:
        return PrepareFailed(
            reason,
            planning.partial("zone", f"node {node_rank} {error.text}"),
            f"{label}: node {node_rank} could not be made a worker "
            f"({error.type}: {error.text}); tearing the whole gang down and "
            f"blocking zone {place} for this job",
        )
    return PrepareFailed(
        reason,
        planning.failed(error.text),
        f"{label}: {error.type}: {error.text}; trying the next offer",
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


@dataclass(frozen=True)
class CheckReading:
    """What a look at the provider means for a machine a worker runs on (see
    :func:`after_check`). Empty (nothing set) when it is still there or its job still saves
    its work."""

    remember_reclaim: bool = False
    """Its try's outcome becomes reclaimed and its offer is held."""
    reclaim_seen_at: float | None = None
    """The wait for a reclaimed job's last report begins now (stored, for a restart)."""
    forget_reclaim_seen: bool = False
    lose: tuple[str, str] | None = None
    """(reason, why) its worker's attempts end with, after which the instance drains."""

    @property
    def ended(self) -> bool:
        return self.lose is not None


def after_check(
    fate: MachineFate,
    *,
    now: float,
    where: str,
    shown_state: str,
    reclaimed_at: float | None,
    has_worker: bool,
    worker_answers: bool,
    grace_seconds: float,
) -> CheckReading:
    """A reclaimed machine whose worker still answers keeps its tunnel while its job saves
    its work (:func:`still_saving`), from when the reclaim was first seen; then, or at once,
    its attempt ends preempted. A machine lost some other way ends its attempt lost."""
    if fate == "there":
        return CheckReading()
    if fate == "lost":
        return CheckReading(lose=("worker_lost", f"{where} is {shown_state}"))
    remember = reclaimed_at is None
    if has_worker and worker_answers:
        seen = now if reclaimed_at is None else reclaimed_at
        if still_saving(seen, now, grace_seconds, worker_answers=True):
            return CheckReading(
                remember_reclaim=remember,
                reclaim_seen_at=now if reclaimed_at is None else None,
            )
    return CheckReading(
        remember_reclaim=remember,
        forget_reclaim_seen=reclaimed_at is not None,
        lose=("preempted", f"{where} was reclaimed by the provider"),
    )
