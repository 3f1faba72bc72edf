import threading

import pytest

from gpulayer import backoff
from gpulayer.backoff import BackoffPolicy


def test_retries_until_success_with_growing_waits() -> None:
    slept: list[float] = []
    calls = 0
    policy = BackoffPolicy("t", initial=0.1, maximum=0.4)
    for attempt in policy.retrying(sleep=slept.append):
        with attempt:
            calls += 1
            if calls < 5:
                raise OSError("not yet")
    assert calls == 5
    assert slept == [0.1, 0.2, 0.4, 0.4]


def test_exception_outside_retry_on_passes_at_once() -> None:
    calls = 0
    with pytest.raises(ValueError):
        for attempt in BackoffPolicy("t", 0.1, 0.1).retrying(
            retry_on=(OSError,), sleep=lambda s: None
        ):
            with attempt:
                calls += 1
                raise ValueError("bad")
    assert calls == 1


def test_retry_if_narrows_which_errors_are_waited_out() -> None:
    calls = 0
    slept: list[float] = []
    with pytest.raises(OSError, match="gone for good"):
        for attempt in BackoffPolicy("t", 0.1, 0.1).retrying(
            retry_if=lambda exc: "in use" in str(exc), sleep=slept.append
        ):
            with attempt:
                calls += 1
                raise OSError("in use" if calls < 3 else "gone for good")
    assert (calls, slept) == (3, [0.1, 0.1])


def test_delay_is_the_wait_retrying_would_sleep() -> None:
    slept: list[float] = []
    policy = BackoffPolicy("t", initial=0.5, maximum=3.0)
    with pytest.raises(ValueError):
        for attempt in policy.retrying(retry_on=(ConnectionError,), sleep=slept.append):
            with attempt:
                if len(slept) == 5:
                    raise ValueError("enough")
                raise ConnectionError("again")
    assert slept == [policy.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert policy.delay(0) == policy.delay(1)


def test_stop_event_raises_last_error_without_waiting() -> None:
    stopped = threading.Event()
    stopped.set()
    with pytest.raises(OSError, match="away"):
        for attempt in BackoffPolicy("t", 100.0, 100.0).retrying(stop_event=stopped):
            with attempt:
                raise OSError("away")


def test_give_up_after_bounds_the_total() -> None:
    calls = 0
    with pytest.raises(OSError, match="down"):
        for attempt in BackoffPolicy("t", 0.05, 0.05, give_up_after=0.3).retrying():
            with attempt:
                calls += 1
                raise OSError("down")
    assert 2 <= calls <= 8


def test_jitter_stays_within_its_bound() -> None:
    policy = BackoffPolicy("t", initial=1.0, maximum=1.0, jitter=0.5)
    slept: list[float] = []
    calls = 0
    for attempt in policy.retrying(sleep=slept.append):
        with attempt:
            calls += 1
            if calls < 20:
                raise OSError
    assert all(1.0 <= s <= 1.5 for s in slept)
    assert len(set(slept)) > 1


def test_every_named_policy_has_a_unique_name() -> None:
    policies = [v for v in vars(backoff).values() if isinstance(v, BackoffPolicy)]
    assert len(policies) >= 5
    assert len({p.name for p in policies}) == len(policies)
