"""The cost ledger's arithmetic: accrued cost per instance, per job and in total."""

from __future__ import annotations

from gpulayer.control.store import InstanceRecord
from gpulayer.control.views import cost_view


def record(
    request_id: str,
    job_id: str,
    price: float | None,
    launched: float | None,
    ended: float | None,
    currency: str = "USD",
) -> InstanceRecord:
    return InstanceRecord(
        request_id=request_id,
        job_id=job_id,
        owner="o",
        provider="aws",
        region="r",
        zone=None,
        instance_type="t",
        instance_id="i",
        state="terminated" if ended else "running",
        ssh_host=None,
        key_path=None,
        hourly_price=price,
        currency=currency,
        spot=False,
        tags={},
        created_at=0.0,
        launched_at=launched,
        ready_at=None,
        ended_at=ended,
        note=None,
    )


def test_cost_is_price_times_hours_from_launch_to_end() -> None:
    assert record("a", "j", 3.6, 1000.0, 1000.0 + 1800).cost(now=99999) == 1.8


def test_a_running_instance_accrues_until_now() -> None:
    assert record("a", "j", 7.2, 0.0, None).cost(now=600.0) == 1.2


def test_never_launched_costs_nothing_and_unknown_price_is_unknown() -> None:
    assert record("a", "j", 2.0, None, None).cost(now=10) == 0.0
    assert record("a", "j", None, 0.0, 100.0).cost(now=10) is None


def test_totals_per_job_and_currency() -> None:
    ledger = cost_view(
        [
            record("a", "j1", 3.6, 0.0, 3600.0),
            record("b", "j1", 1.0, 0.0, 1800.0),
            record("c", "j2", 2.0, 0.0, 3600.0, currency="EUR"),
            record("d", "j2", None, 0.0, 10.0),
        ]
    )
    assert ledger["per_job"] == {"j1": {"USD": 4.1}, "j2": {"EUR": 2.0}}
    assert ledger["total"] == {"USD": 4.1, "EUR": 2.0}
    assert ledger["unpriced_instances"] == 1
