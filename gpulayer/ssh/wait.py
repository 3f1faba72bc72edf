"""Waiting for a fresh machine's sshd: refused, silent or half-started at first, then up."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpulayer.ssh.errors import (
    InvalidSshArgument,
    SshAuthError,
    SshConnectionError,
    SshError,
    SshKeyRefused,
    SshUnreachable,
)
from gpulayer.ssh.hostkeys import HostKeyStore
from gpulayer.ssh.session import SshSession
from gpulayer.ssh.target import SshTarget

if TYPE_CHECKING:  # imported lazily at run time: `gpulayer --help` stays light
    import tenacity

log = logging.getLogger(__name__)

# A try never gets less than this, so the last one before the deadline can still succeed.
_MIN_ATTEMPT_SECONDS = 0.5

AUTH_TRIES = 3
AUTH_SPACING_SECONDS = 5.0
"""A host that answered and refused the key is tried AUTH_TRIES times this far apart (well
inside 15 s): long enough for cloud-init to write a key it installs after sshd starts, short
enough that a key written where sshd does not read ends the wait in seconds, not at the
deadline."""


def wait_for_ssh(
    target: SshTarget,
    deadline_seconds: float,
    *,
    host_keys: HostKeyStore | None = None,
    attempt_timeout: float = 5.0,
    retry_auth: bool = True,
    auth_tries: int = AUTH_TRIES,
    auth_spacing: float = AUTH_SPACING_SECONDS,
    first_backoff: float = 0.25,
    max_backoff: float = 2.0,
    on_progress: Callable[[str], None] | None = None,
    progress_seconds: float = 4.0,
) -> SshSession:
    """Connect to ``target``, retrying with exponential backoff until ``deadline_seconds`` pass.

    Refused connections, timeouts and banner or handshake failures are retried. A refused key
    is retried ``auth_tries`` times ``auth_spacing`` apart (cloud-init may install it after
    sshd starts), then raises SshKeyRefused; with ``retry_auth`` False the first refusal raises
    SshAuthError. A changed host key is never retried. Raises SshUnreachable carrying the last
    error when the deadline passes. ``on_progress`` hears every ``progress_seconds`` which
    attempt runs, for how long the wait has gone on and what the last attempt said, so a long
    wait is never silent (the default stays under the 5 s a cold path may be quiet)."""
    _check_arguments(deadline_seconds, attempt_timeout)
    retryable: tuple[type[SshError], ...] = (
        (SshConnectionError, SshAuthError) if retry_auth else (SshConnectionError,)
    )
    begun = time.monotonic()
    end = begun + deadline_seconds
    attempts = 0
    refusals = _Refusals(str(target), auth_tries if retry_auth else 0, auth_spacing)
    last_error: list[BaseException] = []

    def remaining() -> float:
        return end - time.monotonic()

    def attempt() -> SshSession:
        nonlocal attempts
        attempts += 1
        timeout = max(_MIN_ATTEMPT_SECONDS, min(attempt_timeout, remaining()))
        began = time.monotonic()
        try:
            return SshSession(target, host_keys=host_keys).connect(timeout=timeout)
        except SshAuthError as exc:
            refusals.count(exc, began)
            raise

    def note(state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        if error is not None:
            last_error[:] = [error]
        log.debug("ssh to %s not ready (try %d): %s", target, state.attempt_number, error)

    def report() -> str:
        said = f"; last: {last_error[0]}" if last_error else ""
        return (
            f"waiting for SSH on {target}: attempt {attempts}, "
            f"{time.monotonic() - begun:.0f} s of {deadline_seconds:.0f} s{said}"
        )

    retrying = _retrying(remaining, retryable, note, first_backoff, max_backoff, refusals.pause)
    done = threading.Event()
    ticker = _start_ticker(on_progress, progress_seconds, report, done)
    try:
        session: SshSession = retrying(attempt)
    except SshKeyRefused:
        raise
    except retryable as exc:
        raise SshUnreachable(str(target), deadline_seconds, attempts, exc) from exc
    finally:
        done.set()
        if ticker is not None:
            # A report already under way when the wait ends is heard before it returns,
            # never after: the caller's next lines are not interleaved with a stale one.
            ticker.join()
    return session


# The helpers below are wait_for_ssh's steps, kept apart so it reads as the wait itself.


@dataclass
class _Refusals:
    """The tries a host answered and refused the key on; the ``allowed``-th raises
    SshKeyRefused (0: never, the wait runs to its deadline)."""

    target: str
    allowed: int
    spacing: float
    began: list[float] = field(default_factory=list)

    def pause(self) -> float:
        """Until the next try is ``spacing`` after the last refused one began: tries on a
        slow host are no further apart than on a quick one."""
        return max(0.0, self.spacing - (time.monotonic() - self.began[-1])) if self.began else 0.0

    def count(self, error: SshAuthError, began: float) -> None:
        self.began.append(began)
        if self.allowed and len(self.began) >= self.allowed:
            seconds = time.monotonic() - self.began[0]
            raise SshKeyRefused(self.target, len(self.began), seconds, error) from error


def _check_arguments(deadline_seconds: float, attempt_timeout: float) -> None:
    if not isinstance(deadline_seconds, (int, float)) or not math.isfinite(deadline_seconds):
        raise InvalidSshArgument(f"deadline_seconds must be a number, got {deadline_seconds!r}")
    if deadline_seconds <= 0:
        raise InvalidSshArgument(f"deadline_seconds must be > 0, got {deadline_seconds}")
    if attempt_timeout <= 0:
        raise InvalidSshArgument(f"attempt_timeout must be > 0, got {attempt_timeout}")


def _retrying(
    remaining: Callable[[], float],
    retryable: tuple[type[SshError], ...],
    note: Callable[[tenacity.RetryCallState], None],
    first_backoff: float,
    max_backoff: float,
    auth_pause: Callable[[], float],
) -> tenacity.Retrying:
    """Exponential backoff between tries (after a refused key, ``auth_pause()``), never
    sleeping past the deadline, stopping at it; a key refused for good is not retried."""
    import tenacity

    backoff = tenacity.wait_exponential(
        multiplier=first_backoff, min=first_backoff, max=max_backoff
    )

    def wait(state: tenacity.RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome else None
        pause = auth_pause() if isinstance(error, SshAuthError) else backoff(state)
        return max(0.0, min(pause, remaining()))

    def retry(error: BaseException) -> bool:
        return isinstance(error, retryable) and not isinstance(error, SshKeyRefused)

    def stop(state: tenacity.RetryCallState) -> bool:
        return remaining() <= 0

    return tenacity.Retrying(
        stop=stop,
        wait=wait,
        retry=tenacity.retry_if_exception(retry),
        before_sleep=note,
        reraise=True,
    )


def _start_ticker(
    on_progress: Callable[[str], None] | None,
    progress_seconds: float,
    report: Callable[[], str],
    done: threading.Event,
) -> threading.Thread | None:
    """A thread that hands ``report()`` to ``on_progress`` every ``progress_seconds`` until
    ``done`` is set; None when nobody listens."""
    if on_progress is None:
        return None
    reporter = on_progress

    def tick() -> None:
        while not done.wait(progress_seconds):
            try:
                reporter(report())
            except Exception:
                log.exception("progress report failed")

    ticker = threading.Thread(target=tick, name="gpulayer-ssh-wait", daemon=True)
    ticker.start()
    return ticker
