"""The team queue's pure core, by example: order, quotas with borrowing, budgets."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from gpulayer.admission import (
    ALL_TARGETS,
    Budget,
    BudgetUse,
    Demand,
    Holdings,
    Period,
    Quota,
    ShareLedger,
    TeamPolicy,
    UsageCharge,
    WaitingJob,
    admit_pass,
    budget_refusal,
    period_start,
    quota_verdict,
    worst_case_micros,
)
from gpulayer.admission.budgets import MICROS, never_fits, parse_budget
from gpulayer.admission.quotas import never_held

NOW = datetime(2026, 12, 9, 15, 30, tzinfo=timezone.utc).timestamp()  # a Wednesday


def _job(
    job_id: str,
    team: str,
    *,
    gpus: int = 1,
    priority: int = 50,
    at: float = 0.0,
    target: str = "owned",
    cost: int = 0,
) -> WaitingJob:
    return WaitingJob(
        job_id, team, priority, at, Demand(target, gpus=gpus), cpus=1.0, worst_case_micros=cost
    )


def _gpus(n: int, target: str = ALL_TARGETS, ceiling: int = 0) -> Quota:
    return Quota({(target, "gpus"): n}, {(target, "gpus"): ceiling} if ceiling else {})


def _pass(jobs, teams=(), holdings=None, spent=None, charges=()):
    return admit_pass(
        jobs,
        {t.name: t for t in teams},
        holdings or Holdings(),
        spent or {},
        ShareLedger(charges, now=NOW),
    )


def test_higher_priority_goes_first_whatever_its_age() -> None:
    done = _pass([_job("old", "a", at=1), _job("urgent", "b", priority=90, at=5)])
    assert [w.job_id for w in done.order] == ["urgent", "old"]
    assert [w.position for w in done.order] == [1, 2]


def test_within_a_priority_the_team_that_used_less_goes_first() -> None:
    heavy = UsageCharge("cv", at=NOW - 60, gpu_seconds=8 * 3600)
    done = _pass([_job("cv-1", "cv", at=1), _job("nlp-1", "nlp", at=2)], charges=[heavy])
    assert [w.job_id for w in done.order] == ["nlp-1", "cv-1"]


def test_old_usage_decays() -> None:
    long_ago = UsageCharge("cv", at=NOW - 70 * 24 * 3600, gpu_seconds=1000 * 3600)
    recent = UsageCharge("nlp", at=NOW - 60, gpu_seconds=2 * 3600)
    ledger = ShareLedger([long_ago, recent], now=NOW)
    assert ledger.share("cv") < ledger.share("nlp")


def test_one_teams_many_jobs_interleave_with_anothers() -> None:
    jobs = [_job(f"a{i}", "a", at=i) for i in range(3)] + [_job("b0", "b", at=10)]
    done = _pass(jobs)
    assert [w.job_id for w in done.order][:3] in (["a0", "b0", "a1"], ["b0", "a0", "a1"])


def test_weight_doubles_a_teams_turn() -> None:
    charges = [UsageCharge("a", at=NOW, gpu_seconds=100), UsageCharge("b", at=NOW, gpu_seconds=60)]
    ledger = ShareLedger(charges, now=NOW, weights={"a": 2.0})
    assert ledger.share("a") < ledger.share("b")


def test_quota_holds_a_team_back_and_says_how_much_it_holds() -> None:
    holdings = Holdings.of([("nlp", Demand("owned", gpus=8))])
    done = _pass([_job("j", "nlp")], [TeamPolicy("nlp", quota=_gpus(8))], holdings)
    assert done.held_back == {"j": "quota: team nlp holds 8 of 8 GPUs"}


def test_a_small_job_passes_where_the_teams_large_one_waits() -> None:
    holdings = Holdings.of([("nlp", Demand("owned", gpus=6))])
    jobs = [_job("big", "nlp", gpus=4, at=1), _job("small", "nlp", gpus=2, at=2)]
    done = _pass(jobs, [TeamPolicy("nlp", quota=_gpus(8))], holdings)
    assert done.admitted == ["small"]
    assert "big" in done.held_back


def test_per_target_quota_counts_only_that_target() -> None:
    quota = Quota({("aws", "gpus"): 2})
    holdings = Holdings.of([("nlp", Demand("aws", gpus=2))])
    teams = {"nlp": quota}
    assert not quota_verdict("nlp", Demand("aws", gpus=1), teams, {}, holdings).admitted
    assert quota_verdict("nlp", Demand("owned", gpus=4), teams, {}, holdings).admitted


def test_jobs_and_nodes_are_limited_too() -> None:
    quota = Quota({(ALL_TARGETS, "jobs"): 2, (ALL_TARGETS, "nodes"): 3})
    holdings = Holdings.of([("t", Demand("owned", nodes=2))])
    verdict = quota_verdict("t", Demand("owned", nodes=2), {"t": quota}, {}, holdings)
    assert verdict.reason == "quota: team t holds 2 of 3 nodes"


def test_borrowing_takes_what_the_cohort_leaves_unused_up_to_the_ceiling() -> None:
    teams = [
        TeamPolicy("nlp", quota=_gpus(4, ceiling=2), cohort="lab"),
        TeamPolicy("cv", quota=_gpus(4), cohort="lab"),
    ]
    holdings = Holdings.of([("nlp", Demand("owned", gpus=4)), ("cv", Demand("owned", gpus=1))])
    jobs = [_job(f"n{i}", "nlp", at=i) for i in range(3)]
    done = _pass(jobs, teams, holdings)
    assert done.admitted == ["n0", "n1"]
    assert done.held_back["n2"] == "quota: team nlp holds 6 of 4 GPUs, 2 more borrowed at most"


def test_borrowing_stops_when_the_lenders_use_their_own() -> None:
    teams = [
        TeamPolicy("nlp", quota=_gpus(4, ceiling=4), cohort="lab"),
        TeamPolicy("cv", quota=_gpus(4), cohort="lab"),
    ]
    holdings = Holdings.of([("nlp", Demand("owned", gpus=4)), ("cv", Demand("owned", gpus=3))])
    done = _pass([_job("n0", "nlp", gpus=2)], teams, holdings)
    assert done.held_back == {
        "n0": "quota: team nlp holds 4 of 4 GPUs; its cohort lab has none to lend"
    }


def test_a_lender_within_its_own_quota_is_never_refused() -> None:
    teams = [
        TeamPolicy("nlp", quota=_gpus(4, ceiling=4), cohort="lab"),
        TeamPolicy("cv", quota=_gpus(4), cohort="lab"),
    ]
    holdings = Holdings.of([("nlp", Demand("owned", gpus=8))])
    done = _pass([_job("c0", "cv", gpus=4)], teams, holdings)
    assert done.admitted == ["c0"]


def test_a_job_no_quota_can_ever_hold_is_named_at_submit() -> None:
    quotas = {"nlp": _gpus(4, ceiling=8), "cv": _gpus(2)}
    cohorts = {"nlp": "lab", "cv": "lab"}
    assert never_held("nlp", Demand("owned", gpus=6), quotas, cohorts) is None
    assert never_held("nlp", Demand("owned", gpus=7), quotas, cohorts) == (
        "quota: team nlp may hold at most 6 GPUs; the job needs 7"
    )


def test_budget_counts_settled_spend_and_open_reservations() -> None:
    budget = Budget(50 * MICROS, Period.MONTH)
    use = BudgetUse(settled_micros=30 * MICROS, reserved_micros=11_200_000)
    assert budget_refusal("nlp", budget, use, 8 * MICROS) is None
    assert budget_refusal("nlp", budget, use, 9 * MICROS) == (
        "budget: 41.20 of 50.00 USD this month for team nlp; this job may cost up to 9.00"
    )


def test_budget_reservations_within_a_pass_add_up() -> None:
    team = TeamPolicy("nlp", budget=Budget(10 * MICROS, Period.DAY))
    jobs = [_job(f"j{i}", "nlp", at=i, cost=4 * MICROS) for i in range(3)]
    done = _pass(jobs, [team])
    assert done.admitted == ["j0", "j1"]
    assert done.held_back["j2"].startswith("budget: 8.00 of 10.00 USD this day")


def test_worst_case_rounds_up_and_refuses_negatives() -> None:
    assert worst_case_micros(1.006, 2, 1800) == 1_006_000
    assert worst_case_micros(0.0000001, 1, 1) == 1
    with pytest.raises(ValueError):
        worst_case_micros(-1, 1, 1)
    assert never_fits("t", Budget(MICROS, Period.DAY), 2 * MICROS) is not None


def test_periods_start_in_utc() -> None:
    assert period_start(Period.DAY, NOW) == datetime(2026, 12, 9, tzinfo=timezone.utc).timestamp()
    assert period_start(Period.WEEK, NOW) == datetime(2026, 12, 7, tzinfo=timezone.utc).timestamp()
    assert period_start(Period.MONTH, NOW) == datetime(2026, 12, 1, tzinfo=timezone.utc).timestamp()


@pytest.mark.parametrize("text", ["500", "500/year", "lots/month", "-1/day", "nan/day"])
def test_a_budget_that_is_not_amount_per_period_names_the_field(text: str) -> None:
    with pytest.raises(ValueError, match=r"^--budget: .* is not AMOUNT/PERIOD"):
        parse_budget(text, field="--budget")


def test_priority_above_the_teams_ceiling_is_for_admins_only() -> None:
    team = TeamPolicy("nlp", max_priority=60)
    assert team.priority_refusal(60, admin=False) is None
    assert team.priority_refusal(90, admin=True) is None
    assert team.priority_refusal(90, admin=False) == (
        "placement.priority: 90 is above team nlp's max_priority 60; only an admin may ask for more"
    )
