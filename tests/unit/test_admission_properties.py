"""Properties of one admission pass over random teams, quotas, budgets, usage and queues."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

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
)
from gpulayer.admission.quotas import RESOURCES

NOW = 1_800_000_000.0
TEAMS = ("a", "b", "c", "d")
TARGETS = ("owned", "aws", "slurm:hpc")


@st.composite
def quotas(draw: st.DrawFn) -> Quota:
    nominal = {}
    ceiling = {}
    for target in (ALL_TARGETS, *TARGETS):
        for resource in RESOURCES:
            if draw(st.booleans()):
                nominal[(target, resource)] = draw(st.integers(0, 8))
                ceiling[(target, resource)] = draw(st.integers(0, 4))
    return Quota(nominal, ceiling)


@st.composite
def worlds(draw: st.DrawFn):
    teams = {}
    for name in TEAMS:
        quota = draw(st.none() | quotas())
        budget = draw(
            st.none() | st.integers(0, 20).map(lambda d: Budget(d * 1_000_000, Period.DAY))
        )
        cohort = draw(st.sampled_from([None, "lab", "lab", "other"]))
        teams[name] = TeamPolicy(
            name, quota, budget, cohort, weight=draw(st.sampled_from([0.5, 1.0, 2.0]))
        )
    demands = st.builds(
        Demand,
        target=st.sampled_from(TARGETS),
        gpus=st.integers(0, 4),
        nodes=st.integers(1, 2),
    )
    running = draw(st.lists(st.tuples(st.sampled_from(TEAMS), demands), max_size=8))
    spent = {
        name: BudgetUse(draw(st.integers(0, 5)) * 1_000_000, draw(st.integers(0, 3)) * 500_000)
        for name in TEAMS
    }
    charges = draw(
        st.lists(
            st.builds(
                UsageCharge,
                team=st.sampled_from(TEAMS),
                at=st.floats(NOW - 30 * 86400, NOW),
                gpu_seconds=st.floats(0, 1e5),
                cpu_seconds=st.floats(0, 1e5),
                spend_micros=st.floats(0, 1e8),
            ),
            max_size=10,
        )
    )
    jobs = draw(
        st.lists(
            st.builds(
                WaitingJob,
                job_id=st.just(""),
                team=st.sampled_from(TEAMS),
                priority=st.sampled_from([10, 50, 50, 90]),
                enqueued_at=st.floats(NOW - 3600, NOW),
                demand=demands,
                cpus=st.floats(0, 8),
                worst_case_micros=st.integers(0, 6).map(lambda d: d * 1_000_000),
            ),
            max_size=25,
        )
    )
    jobs = [WaitingJob(**{**job.__dict__, "job_id": f"j{i}"}) for i, job in enumerate(jobs)]
    return teams, running, spent, charges, jobs


def _run(world):
    teams, running, spent, charges, jobs = world
    holdings = Holdings.of(running)
    ledger = ShareLedger(charges, now=NOW, weights={t.name: t.weight for t in teams.values()})
    return admit_pass(jobs, teams, holdings, spent, ledger), holdings, ledger


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_no_admission_puts_a_team_over_its_quota(world) -> None:
    teams, running, _, _, jobs = world
    done, before, _ = _run(world)
    after = Holdings.of(running)
    by_id = {job.job_id: job for job in jobs}
    for job_id in done.admitted:
        after.add(by_id[job_id].team, by_id[job_id].demand)
    for name, team in teams.items():
        if team.quota is None:
            continue
        for key, nominal in team.quota.nominal.items():
            most = nominal + team.quota.ceiling(key) if team.cohort else nominal
            # A team already over (its quota lowered while it ran) gains nothing more.
            assert after.held(name, key) <= max(most, before.held(name, key))


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_a_cohorts_loans_never_exceed_what_its_lenders_leave(world) -> None:
    teams, running, _, _, jobs = world
    done, _, _ = _run(world)
    held = Holdings.of(running)
    by_id = {job.job_id: job for job in jobs}
    for job_id in done.admitted:
        job = by_id[job_id]
        held.add(job.team, job.demand)
        team = teams[job.team]
        if team.quota is None or team.cohort is None:
            continue
        for key, _ in job.demand.amounts():
            nominal = team.quota.nominal.get(key)
            if nominal is None or held.held(job.team, key) <= nominal:
                continue
            lent = unused = 0
            for other in teams.values():
                if other.cohort != team.cohort or other.quota is None:
                    continue
                own = other.quota.nominal.get(key)
                if own is None:
                    continue
                lent += max(0, held.held(other.name, key) - own)
                unused += max(0, own - held.held(other.name, key))
            assert lent <= unused


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_no_admission_overspends_a_budget(world) -> None:
    teams, _, spent, _, jobs = world
    done, _, _ = _run(world)
    reserved: defaultdict[str, int] = defaultdict(int)
    by_id = {job.job_id: job for job in jobs}
    for job_id in done.admitted:
        reserved[by_id[job_id].team] += by_id[job_id].worst_case_micros
    for name, team in teams.items():
        if team.budget is not None and reserved[name]:
            assert spent[name].committed_micros + reserved[name] <= team.budget.limit_micros


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_priorities_are_honoured_and_every_job_is_placed_in_the_order_once(world) -> None:
    *_, jobs = world
    done, _, _ = _run(world)
    by_id = {job.job_id: job for job in jobs}
    assert sorted(w.job_id for w in done.order) == sorted(by_id)
    priorities = [by_id[w.job_id].priority for w in done.order]
    assert priorities == sorted(priorities, reverse=True)
    assert [w.position for w in done.order] == list(range(1, len(jobs) + 1))


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_a_team_under_its_share_is_never_served_after_one_over_it(world) -> None:
    *_, jobs = world
    done, _, ledger = _run(world)
    by_id = {job.job_id: job for job in jobs}
    # The top priority's turns are taken on the shares given; lower ones also count what the
    # pass admitted above them.
    top = max((job.priority for job in jobs), default=0)
    first: dict[str, int] = {}
    for w in done.order:
        if by_id[w.job_id].priority == top:
            first.setdefault(w.team, w.position)
    for under in first:
        for over in first:
            if ledger.share(under) < ledger.share(over):
                assert first[under] < first[over]


@settings(max_examples=100, deadline=None)
@given(worlds())
def test_a_pass_changes_none_of_what_it_is_given(world) -> None:
    teams, running, _, _, _ = world
    _, holdings, ledger = _run(world)
    shares = {name: ledger.share(name) for name in teams}
    untouched = Holdings.of(running)
    for name in teams:
        for target in (ALL_TARGETS, *TARGETS):
            for resource in RESOURCES:
                assert holdings.held(name, (target, resource)) == untouched.held(
                    name, (target, resource)
                )
    assert shares == {name: ledger.share(name) for name in teams}
