"""Named backoff policies. Every loop in gpulayer that waits and tries again takes one of these,
so how it backs off is decided here, in one table, and tenacity does the waiting."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tenacity


@dataclass(frozen=True)
class BackoffPolicy:
    """Exponential waits from `initial` seconds, doubling up to `maximum`, with up to `jitter`
    seconds added at random (so many clients that lost one server do not return in step), for
    at most `give_up_after` seconds in all (None: until the caller's stop event is set)."""

    name: str
    initial: float
    maximum: float
    jitter: float = 0.0
    give_up_after: float | None = None

    def wait(self) -> tenacity.wait.wait_base:
        exponential = tenacity.wait_exponential(
            multiplier=self.initial, min=self.initial, max=self.maximum
        )
        if self.jitter <= 0:
            return exponential
        return exponential + tenacity.wait_random(0, self.jitter)

    def delay(self, tries: int) -> float:
        """The wait after the `tries`-th failed try (1: the first), as `retrying` would wait:
        for loops that record when to try again rather than sleep (a reconciler's records)."""
        state = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})
        state.attempt_number = max(1, tries)
        return float(self.wait()(state))

    def retrying(
        self,
        *,
        retry_on: tuple[type[BaseException], ...] = (Exception,),
        retry_if: Callable[[BaseException], bool] | None = None,
        stop_event: threading.Event | None = None,
        give_up_after: float | None = None,
        before_sleep: Callable[[tenacity.RetryCallState], None] | None = None,
        sleep: Callable[[float], Any] | None = None,
    ) -> tenacity.Retrying:
        """A tenacity.Retrying under this policy. Exceptions outside `retry_on`, or that
        `retry_if` (when given) says no to (an error code not worth waiting out), pass at
        once; when the time is up or `stop_event` is set, the last exception is raised. A stop
        event also cuts a wait short, so a stopping caller never sleeps out a long backoff."""
        stops: list[tenacity.stop.stop_base] = []
        limit = give_up_after if give_up_after is not None else self.give_up_after
        if limit is not None:
            stops.append(tenacity.stop_after_delay(limit))
        if stop_event is not None:
            stops.append(tenacity.stop_when_event_set(stop_event))
        stop: tenacity.stop.stop_base = tenacity.stop_never
        for each in stops:
            stop = each if stop is tenacity.stop_never else stop | each
        pause: Callable[[float], Any] = sleep or tenacity.nap.sleep
        if sleep is None and stop_event is not None:
            pause = stop_event.wait
        retry: tenacity.retry_base = tenacity.retry_if_exception_type(retry_on)
        if retry_if is not None:
            retry = retry & tenacity.retry_if_exception(retry_if)
        return tenacity.Retrying(
            wait=self.wait(),
            stop=stop,
            retry=retry,
            before_sleep=before_sleep,
            sleep=lambda seconds: pause(seconds),
            reraise=True,
        )


# The table. A new loop picks one of these or adds a row here.
WORKER_JOIN = BackoffPolicy("worker-join", initial=0.2, maximum=10.0, jitter=0.5)
WORKER_REPORT = BackoffPolicy("worker-report", initial=0.2, maximum=10.0, jitter=0.2)
# What an attempt cannot start without (its source, its inputs), while the control plane is away.
WORKER_PREPARE = BackoffPolicy("worker-prepare", initial=0.2, maximum=10.0, give_up_after=300.0)
WORKER_OUTPUTS = BackoffPolicy("worker-outputs", initial=0.2, maximum=10.0, give_up_after=300.0)
# A command channel sshd refused to start while its session limit (MaxSessions, 10 by default)
# still counted channels just closed: the command never ran, so starting it again is safe.
SSH_CHANNEL_START = BackoffPolicy("ssh-channel-start", initial=0.05, maximum=1.0, give_up_after=5.0)
WORKER_CLAIM = BackoffPolicy("worker-claim", initial=1.0, maximum=1.0)
# `logs -f` and `submit` following a job while its control plane restarts.
FOLLOW_RECONNECT = BackoffPolicy(
    "follow-reconnect", initial=0.2, maximum=2.0, jitter=0.2, give_up_after=120.0
)
CONTROL_PLANE_START = BackoffPolicy("control-plane-start", initial=0.01, maximum=0.2)
CLOUD_TEARDOWN_POLL = BackoffPolicy("cloud-teardown-poll", initial=2.0, maximum=15.0)
# When a cloud record is looked at again: a place that refused for capacity, a terminate that
# failed (the reconciler records the time; it never sleeps).
CLOUD_CAPACITY_RETRY = BackoffPolicy("cloud-capacity-retry", initial=5.0, maximum=60.0)
CLOUD_TERMINATE_RETRY = BackoffPolicy("cloud-terminate-retry", initial=2.0, maximum=60.0)
# A resource the cloud still holds on to for a while after what used it ended (a security
# group a terminated instance's network interface still uses): each try is one API call.
CLOUD_RESOURCE_RELEASE = BackoffPolicy("cloud-resource-release", initial=1.0, maximum=10.0)
