"""What a step's I/O found, read as data: a launch's exception into its move and outcome, the
provider's answer into a machine's fate, and the wait for a reclaimed job's last report. Pure:
no provider, no store."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulayer.cloud.errors import CapacityError, ProviderError, ProviderSettingsError, QuotaError
from gpulayer.cloud.lifecycle import planning
from gpulayer.cloud.lifecycle.results import (
    RECLAIM_UPLOAD_MARGIN_SECONDS,
    after_config_error,
    launch_failed,
    machine_fate,
    still_saving,
)
from gpulayer.cloud.protocol import Instance
from gpulayer.errors import UsageError


def _machine(state: str, *, reclaimed: bool = False) -> Instance:
    return Instance.model_validate(
        {"id": "i-1", "provider": "aws", "region": "r1", "state": state, "ssh_user": "ubuntu"}
        | {"reclaimed": reclaimed}
    )


def test_a_refusal_creates_nothing_and_blocks_its_place() -> None:
    failed = launch_failed(CapacityError("zone", "aws", "r1", "z1", "no room"))
    assert failed.to == "never_launched" and not failed.config
    assert failed.end == planning.refused("capacity", "zone", "no room")
    assert failed.reason == "capacity: aws: no room (zone z1)"
    assert failed.then == "blocking that zone and moving on"
    quota = launch_failed(QuotaError("aws", "r1", "over quota"))
    assert quota.end.outcome == "quota" and quota.then == "blocking that region and moving on"


def test_a_configuration_error_creates_nothing_and_counts_per_provider() -> None:
    for error in (UsageError("no image for release 9"), ProviderSettingsError("bad key")):
        failed = launch_failed(error)
        assert failed.to == "never_launched" and failed.config
        assert failed.end == planning.misconfigured(str(error))
        assert failed.reason == f"configuration error: {error}"
    assert after_config_error("aws", 1) == "trying the next offer"
    tries = planning.CONFIG_TRIES_PER_PROVIDER
    assert after_config_error("aws", tries) == "not trying aws again"


@pytest.mark.parametrize(
    "error", [RuntimeError("timed out"), ProviderError("HTTP 500", provider="aws"), OSError("x")]
)
def test_any_other_launch_error_may_have_created_something_so_it_is_terminated(
    error: Exception,
) -> None:
    failed = launch_failed(error)
    assert (failed.to, failed.config) == ("terminating", False)
    assert failed.end == planning.failed(str(error))
    assert failed.reason == f"launch failed: {error}"


def test_a_machine_is_there_reclaimed_or_lost_as_the_provider_shows_it() -> None:
    assert machine_fate(_machine("running"), None) == "there"
    assert machine_fate(_machine("pending"), "reclaimed") == "there"
    assert machine_fate(None, None) == "reclaimed"  # the provider no longer shows it at all
    assert machine_fate(_machine("terminated", reclaimed=True), None) == "reclaimed"
    # Seen reclaimed once, reclaimed still: shown later as merely ended (Slurm's MinJobAge).
    assert machine_fate(_machine("terminated"), "reclaimed") == "reclaimed"
    assert machine_fate(_machine("terminated"), None) == "lost"
    assert machine_fate(_machine("stopping"), "capacity") == "lost"


@given(
    seen=st.none() | st.floats(0, 1_000),
    later=st.floats(0, 1_000),
    grace=st.floats(0, 300),
    answers=st.booleans(),
)
def test_a_reclaimed_job_saves_its_work_for_its_grace_and_the_margin_only(
    seen: float | None, later: float, grace: float, answers: bool
) -> None:
    now = (seen or 0.0) + later
    saving = still_saving(seen, now, grace, worker_answers=answers)
    if not answers:
        assert not saving  # a worker gone silent ends the wait
    elif seen is None:
        assert saving  # the wait begins now
    else:
        assert saving == (now - seen < grace + RECLAIM_UPLOAD_MARGIN_SECONDS)
