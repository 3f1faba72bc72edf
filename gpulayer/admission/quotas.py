"""Quota admission: how much of each resource a team may hold, per target and in all.

A quota names a nominal amount per (target, resource): GPUs, jobs and nodes, on one target
(``owned``, a cloud provider's name, ``slurm:CLUSTER``) or on every target at once
(:data:`ALL_TARGETS`). A team within its nominal amount is always admitted: that much is its
own. A team of a cohort may go over it by borrowing what the cohort's other teams leave unused,
up to its own borrowing ceiling; it gives the loan back when the job that took it ends (no job
is ended to reclaim a loan), so a borrowed unit is never lent twice: the cohort's loans after an
admission never exceed what its lenders leave unused.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

ALL_TARGETS = "*"
"""The target of a limit that counts what a team holds on every target together."""

RESOURCES = ("gpus", "jobs", "nodes")
_SHOWN = {"gpus": "GPUs", "jobs": "jobs", "nodes": "nodes"}

Key = tuple[str, str]
"""(target, resource)."""


@dataclass(frozen=True)
class Demand:
    """What one job holds while it runs."""

    target: str
    gpus: int = 0
    nodes: int = 1
    jobs: int = 1

    def amount(self, resource: str) -> int:
        return int(getattr(self, resource))

    def amounts(self) -> Iterable[tuple[Key, int]]:
        for resource in RESOURCES:
            amount = self.amount(resource)
            if amount:
                yield (self.target, resource), amount
                yield (ALL_TARGETS, resource), amount


@dataclass(frozen=True)
class Quota:
    nominal: Mapping[Key, int] = field(default_factory=dict)
    """(target, resource) -> what the team owns; a key not named is not limited."""
    borrowing_ceiling: Mapping[Key, int] = field(default_factory=dict)
    """(target, resource) -> the most it may hold beyond nominal by borrowing; unnamed: 0."""

    def ceiling(self, key: Key) -> int:
        return int(self.borrowing_ceiling.get(key, 0))


class Holdings:
    """What each team holds now: (target, resource) amounts, the all-targets sums kept too."""

    def __init__(self) -> None:
        self._held: dict[str, defaultdict[Key, int]] = defaultdict(lambda: defaultdict(int))

    @classmethod
    def of(cls, running: Iterable[tuple[str, Demand]]) -> Holdings:
        holdings = cls()
        for team, demand in running:
            holdings.add(team, demand)
        return holdings

    def held(self, team: str, key: Key) -> int:
        return self._held[team][key] if team in self._held else 0

    def add(self, team: str, demand: Demand) -> None:
        for key, amount in demand.amounts():
            self._held[team][key] += amount

    def copy(self) -> Holdings:
        other = Holdings()
        for team, held in self._held.items():
            other._held[team].update(held)
        return other


@dataclass(frozen=True)
class QuotaVerdict:
    admitted: bool
    reason: str | None = None
    """Why not, as the queue shows it: ``quota: team nlp holds 8 of 8 GPUs``."""
    borrows: bool = False


def quota_verdict(
    team: str,
    demand: Demand,
    quotas: Mapping[str, Quota],
    cohorts: Mapping[str, str],
    holdings: Holdings,
) -> QuotaVerdict:
    """Whether ``team`` may take ``demand`` on top of ``holdings``.

    ``quotas`` maps each team with a quota to it; ``cohorts`` maps teams to their cohort's name
    (a team in none borrows nothing and lends nothing).
    """
    return QuotaBook(quotas, cohorts, holdings).verdict(team, demand)


class QuotaBook:
    """Quota admission over one pass: holdings grow as jobs are taken, and each cohort's loans
    and lenders' unused amounts are kept as sums, so a verdict costs the same with 50 teams as
    with 2."""

    def __init__(
        self, quotas: Mapping[str, Quota], cohorts: Mapping[str, str], holdings: Holdings
    ) -> None:
        self._quotas = quotas
        self._cohorts = {team: cohort for team, cohort in cohorts.items() if team in quotas}
        self._held = holdings.copy()
        self._sums: dict[tuple[str, Key], list[int]] = {}

    @property
    def holdings(self) -> Holdings:
        return self._held

    def verdict(self, team: str, demand: Demand) -> QuotaVerdict:
        quota = self._quotas.get(team)
        if quota is None:
            return QuotaVerdict(True)
        borrows = False
        for key, amount in demand.amounts():
            nominal = quota.nominal.get(key)
            if nominal is None:
                continue
            held = self._held.held(team, key)
            after = held + amount
            if after <= nominal:
                continue
            shown = _holds(team, key, held, nominal)
            cohort = self._cohorts.get(team)
            if cohort is None:
                return QuotaVerdict(False, f"quota: {shown}")
            ceiling = quota.ceiling(key)
            if after > nominal + ceiling:
                return QuotaVerdict(False, f"quota: {shown}, {ceiling} more borrowed at most")
            lent, unused = self._cohort_sums(cohort, key)
            lent += _over(after, nominal) - _over(held, nominal)
            unused += _over(nominal, after) - _over(nominal, held)
            if lent > unused:
                return QuotaVerdict(False, f"quota: {shown}; its cohort {cohort} has none to lend")
            borrows = True
        return QuotaVerdict(True, borrows=borrows)

    def take(self, team: str, demand: Demand) -> None:
        quota = self._quotas.get(team)
        cohort = self._cohorts.get(team)
        for key, amount in demand.amounts():
            nominal = quota.nominal.get(key) if quota is not None else None
            sums = self._sums.get((cohort, key)) if cohort is not None else None
            if sums is not None and nominal is not None:
                held = self._held.held(team, key)
                sums[0] += _over(held + amount, nominal) - _over(held, nominal)
                sums[1] += _over(nominal, held + amount) - _over(nominal, held)
        self._held.add(team, demand)

    def _cohort_sums(self, cohort: str, key: Key) -> tuple[int, int]:
        """What the cohort's members have borrowed of ``key``, and what they leave unused.
        Teams without a limit on the key neither lend nor borrow it."""
        sums = self._sums.get((cohort, key))
        if sums is None:
            lent = unused = 0
            for name, of in self._cohorts.items():
                nominal = self._quotas[name].nominal.get(key)
                if of != cohort or nominal is None:
                    continue
                held = self._held.held(name, key)
                lent += _over(held, nominal)
                unused += _over(nominal, held)
            sums = self._sums[(cohort, key)] = [lent, unused]
        return sums[0], sums[1]


def _over(amount: int, limit: int) -> int:
    return max(0, amount - limit)


def never_held(
    team: str, demand: Demand, quotas: Mapping[str, Quota], cohorts: Mapping[str, str]
) -> str | None:
    """Why the team's quota can never hold the job, even with nothing else running; else None."""
    quota = quotas.get(team)
    if quota is None:
        return None
    cohort = cohorts.get(team)
    for key, amount in demand.amounts():
        nominal = quota.nominal.get(key)
        if nominal is None:
            continue
        most = nominal
        if cohort is not None:
            lenders = sum(
                quotas[name].nominal.get(key, 0)
                for name, of in cohorts.items()
                if of == cohort and name != team and name in quotas
            )
            most += min(quota.ceiling(key), lenders)
        if amount > most:
            target, resource = key
            where = "" if target == ALL_TARGETS else f" on {target}"
            return (
                f"quota: team {team} may hold at most {most} {_SHOWN[resource]}{where}; "
                f"the job needs {amount}"
            )
    return None


def _holds(team: str, key: Key, held: int, nominal: int) -> str:
    target, resource = key
    where = "" if target == ALL_TARGETS else f" on {target}"
    return f"team {team} holds {held} of {nominal} {_SHOWN[resource]}{where}"
