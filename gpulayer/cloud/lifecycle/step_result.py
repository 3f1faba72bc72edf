"""What a lifecycle step found, as data: the step (launch, prepare, reconnect, check, drain,
terminate, reap) does its I/O and returns a :class:`StepResult` rather than deciding inside an
``except``: an exception becomes a :class:`StepError` (its class, text and, for a provider's
refusal, its kind and scope), and the pure readings in :mod:`.results` say what it means for
the instance. The result is stored with the instance (``last_step``, ``last_step_result``,
``step_at``), so a restarted controller, a second one and the instance listing read what the
last step found, and the pass's decision reads its ``not_before``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Literal

StepName = Literal["launch", "prepare", "reconnect", "check", "drain", "terminate", "reap"]
StepOutcome = Literal["done", "failed", "skipped"]
"""done: the step did its I/O and it went through; failed: it raised (``error`` says what);
skipped: the record had moved on (or its provider was not there) and nothing was called."""


@dataclass(frozen=True)
class StepError:
    """An exception, kept as data."""

    type: str
    """Its class name (``CapacityError``, ``TimeoutError``, ...)."""
    text: str
    """``str(exc)``, as the job's log shows it."""
    kind: str = "error"
    """``capacity``, ``quota``, ``auth``... for a provider's scoped refusal; ``config`` for a
    configuration error (refused before any call that creates); ``error`` otherwise."""
    scope: str | None = None
    """How far a scoped refusal reaches (offer, zone, region, provider)."""
    message: str | None = None
    """A scoped refusal's own message, without the place the text adds."""


@dataclass(frozen=True)
class StepResult:
    step: StepName
    at: float
    outcome: StepOutcome
    note: str = ""
    """What happened, in a few words (`launched i-0abc`, `the machine is there`)."""
    error: StepError | None = None
    move_to: str | None = None
    """The state the result moved the instance to, when it moved it."""
    not_before: float | None = None
    """When the step may run again (a retry's backoff); None: whenever the state asks."""
    found: str | None = None
    """What a look at the provider found (a check: there, reclaimed or lost)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> StepResult | None:
        """The stored result; None when there is none or it cannot be read (a newer shape)."""
        if not text:
            return None
        try:
            raw: dict[str, Any] = json.loads(text)
            error = raw.pop("error", None)
            return cls(**raw, error=StepError(**error) if error else None)
        except (TypeError, ValueError):
            return None

    def columns(self) -> dict[str, Any]:
        """The instance's columns that keep it; a not_before is its step's backoff, which the
        decision reads (and ``gpulayer cloud reap`` clears)."""
        values: dict[str, Any] = {
            "last_step": self.step,
            "last_step_result": self.to_json(),
            "step_at": self.at,
        }
        if self.not_before is not None:
            values["next_step_at"] = self.not_before
        return values


def done(step: StepName, at: float, note: str = "", **values: Any) -> StepResult:
    return StepResult(step, at, "done", note, **values)


def skipped(step: StepName, at: float, note: str = "") -> StepResult:
    return StepResult(step, at, "skipped", note)


def failed(step: StepName, at: float, error: StepError, **values: Any) -> StepResult:
    return StepResult(step, at, "failed", error.text, error=error, **values)
