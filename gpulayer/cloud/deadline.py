"""A bound on waiting for clouds.

The SDKs' own timeouts apply per request and are retried (botocore: a 60 s read, several
attempts; Google's clients: minutes of retries), so a cloud that accepts a connection and never
answers could hold `gpulayer offers` or a job's placement for many minutes. Here every
provider's call runs beside the others and is given up once ``seconds`` have passed (the
``gpulayer.cloud_wait_seconds`` setting), with the provider and what was asked of it named.
A call given up keeps its thread until the SDK's own timeout ends it; its answer is dropped.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from gpulayer.cloud.errors import ProviderError

T = TypeVar("T")

DEFAULT_WAIT_SECONDS = 30.0
"""The ``gpulayer.cloud_wait_seconds`` default."""


class CloudWaitTimeout(ProviderError):
    """A provider did not answer within the allowed time."""

    def __init__(self, provider: str, what: str, seconds: float) -> None:
        super().__init__(f"no answer within {seconds:g} s while {what}", provider=provider)
        self.seconds = seconds


class _Call(Generic[T]):
    def __init__(self, function: Callable[[], T]) -> None:
        self.result: T | None = None
        self.error: BaseException | None = None
        # Cloud calls read the caller's context (the submitter's credentials, see
        # gpulayer.cloud.credentials); a new thread starts with an empty one.
        context = contextvars.copy_context()
        self.thread = threading.Thread(
            target=context.run, args=(self._run, function), daemon=True, name="cloud-call"
        )
        self.thread.start()

    def _run(self, function: Callable[[], T]) -> None:
        try:
            self.result = function()
        except BaseException as exc:  # handed to the waiting caller, which re-raises it
            self.error = exc


SLOW_SECONDS = 2.0
"""When a wait is reported as slow (see ``on_slow``)."""


def _join_until(calls: Mapping[str, _Call[T]], until: float) -> list[str]:
    for call in calls.values():
        call.thread.join(max(0.0, until - time.monotonic()))
    return [name for name, call in calls.items() if call.thread.is_alive()]


def call_each_within(
    calls: Mapping[str, Callable[[], T]],
    seconds: float,
    what: str,
    *,
    on_slow: Callable[[list[str]], None] | None = None,
) -> dict[str, T | BaseException]:
    """Run every provider's call at once; provider -> its answer, or the exception it raised,
    or a :class:`CloudWaitTimeout` for one still waiting after ``seconds`` in all.
    ``on_slow`` hears the providers still waited for after :data:`SLOW_SECONDS`."""
    started = {name: _Call(function) for name, function in calls.items()}
    begun = time.monotonic()
    deadline = begun + seconds
    if on_slow is not None and seconds > SLOW_SECONDS:
        pending = _join_until(started, begun + SLOW_SECONDS)
        if pending:
            on_slow(pending)
    _join_until(started, deadline)
    answers: dict[str, T | BaseException] = {}
    for name, call in started.items():
        if call.thread.is_alive():
            answers[name] = CloudWaitTimeout(name, what, seconds)
        elif call.error is not None:
            answers[name] = call.error
        else:
            answers[name] = call.result  # type: ignore[assignment]
    return answers


def call_within(provider: str, function: Callable[[], T], seconds: float, what: str) -> T:
    """``function()``'s answer, or :class:`CloudWaitTimeout` once ``seconds`` have passed."""
    answer = call_each_within({provider: function}, seconds, what)[provider]
    if isinstance(answer, BaseException):
        raise answer
    return answer
