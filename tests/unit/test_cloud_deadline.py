"""The bound on waiting for providers: answers pass through, a provider still silent at the
deadline is given up by name, and the caller's context reaches the calls."""

from __future__ import annotations

import threading

import pytest

from gpulayer.cloud.credentials import credentials_environment, using_environment
from gpulayer.cloud.deadline import CloudWaitTimeout, call_each_within, call_within
from gpulayer.cloud.errors import ProviderError


def test_answers_errors_and_silence_each_come_back_by_provider() -> None:
    never = threading.Event()
    slow: list[list[str]] = []

    def fails() -> list[str]:
        raise ProviderError("no credentials", provider="gcp")

    def silent() -> list[str]:
        never.wait()
        return []

    try:
        answers = call_each_within(
            {"aws": lambda: ["p4d"], "gcp": fails, "azure": silent},
            0.3,
            "listing offers",
            on_slow=slow.append,
        )
    finally:
        never.set()
    assert answers["aws"] == ["p4d"]
    assert isinstance(answers["gcp"], ProviderError)
    given_up = answers["azure"]
    assert isinstance(given_up, CloudWaitTimeout) and given_up.provider == "azure"
    assert str(given_up) == "azure: no answer within 0.3 s while listing offers"
    # Under the two seconds a slow wait is reported after, nobody is told.
    assert slow == []


def test_calls_read_the_callers_credentials_environment() -> None:
    with using_environment({"AWS_PROFILE": "lab"}):
        seen = call_within("aws", lambda: dict(credentials_environment()), 5, "x")
    assert seen == {"AWS_PROFILE": "lab"}


def test_a_single_call_raises_what_its_provider_raised() -> None:
    def fails() -> None:
        raise ProviderError("denied", provider="aws")

    with pytest.raises(ProviderError, match=r"^aws: denied$"):
        call_within("aws", fails, 5, "listing offers")
