"""One admission pass: the queue's order, and which jobs its quotas and budgets let start.

Jobs of a higher ``placement.priority`` come first. Within a priority, the team with the
smallest dominant share goes next (its oldest job first); each job admitted is charged to its
team's share at once, for the time it expects to run, so one team's many jobs interleave with
the others' instead of all going first. A job its team's quota or budget cannot take now is
held back with the reason and the team's next job is considered (a small job may still fit
where a large one does not). Admitted jobs go to placement in this order; placement decides
where, and which of them capacity lets start.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpulayer.admission.budgets import BudgetUse, budget_refusal
from gpulayer.admission.fair_share import ShareLedger, UsageCharge
from gpulayer.admission.quotas import Demand, Holdings, Quota, QuotaBook
from gpulayer.admission.teams import TeamPolicy

DEFAULT_EXPECTED_SECONDS = 3600.0


@dataclass(frozen=True)
class WaitingJob:
    job_id: str
    team: str
    priority: int
    enqueued_at: float
    demand: Demand
    """What it holds while it runs; ``demand.gpus`` counts every node's GPUs."""
    cpus: float = 0.0
    worst_case_micros: int = 0
    """What its budget reservation would hold: 0 on targets that cost nothing."""
    expected_seconds: float = DEFAULT_EXPECTED_SECONDS
    """How long it is taken to run when charged to its team's share within a pass."""


@dataclass(frozen=True)
class Waiting:
    job_id: str
    team: str
    position: int
    """1 for the job considered first."""
    reason: str | None
    """Why quota or budget hold it back; None when admitted (placement decides the rest)."""


@dataclass(frozen=True)
class AdmissionPass:
    order: tuple[Waiting, ...]

    @property
    def admitted(self) -> list[str]:
        return [item.job_id for item in self.order if item.reason is None]

    @property
    def held_back(self) -> dict[str, str]:
        return {item.job_id: item.reason for item in self.order if item.reason is not None}


def admit_pass(
    jobs: Sequence[WaitingJob],
    teams: Mapping[str, TeamPolicy],
    holdings: Holdings,
    budget_use: Mapping[str, BudgetUse],
    shares: ShareLedger,
) -> AdmissionPass:
    """The order and admissions of one pass; ``holdings`` and ``shares`` are not changed."""
    spent = dict(budget_use)
    quotas: dict[str, Quota] = {name: t.quota for name, t in teams.items() if t.quota is not None}
    cohorts = {name: t.cohort for name, t in teams.items() if t.cohort is not None}
    book = QuotaBook(quotas, cohorts, holdings)
    pass_shares = shares.copy()
    order: list[Waiting] = []
    for level in sorted({job.priority for job in jobs}, reverse=True):
        queues: defaultdict[str, deque[WaitingJob]] = defaultdict(deque)
        for job in sorted(
            (job for job in jobs if job.priority == level),
            key=lambda job: (job.enqueued_at, job.job_id),
        ):
            queues[job.team].append(job)
        heap = [_turn(pass_shares, team, queue[0]) for team, queue in queues.items()]
        heapq.heapify(heap)
        while heap:
            *_, team = heapq.heappop(heap)
            job = queues[team].popleft()
            reason = _refusal(job, teams, book, spent)
            if reason is None:
                book.take(team, job.demand)
                spent[team] = spent.get(team, BudgetUse()).reserve(job.worst_case_micros)
                pass_shares.charge(
                    UsageCharge(
                        team,
                        at=shares.now,
                        gpu_seconds=job.demand.gpus * job.expected_seconds,
                        cpu_seconds=job.cpus * job.expected_seconds,
                        spend_micros=job.worst_case_micros,
                    )
                )
            order.append(Waiting(job.job_id, team, len(order) + 1, reason))
            if queues[team]:
                heapq.heappush(heap, _turn(pass_shares, team, queues[team][0]))
    return AdmissionPass(tuple(order))


def _turn(shares: ShareLedger, team: str, head: WaitingJob) -> tuple[float, float, str, str]:
    return (shares.share(team), head.enqueued_at, head.job_id, team)


def _refusal(
    job: WaitingJob,
    teams: Mapping[str, TeamPolicy],
    book: QuotaBook,
    spent: Mapping[str, BudgetUse],
) -> str | None:
    verdict = book.verdict(job.team, job.demand)
    if not verdict.admitted:
        return verdict.reason
    policy = teams.get(job.team)
    budget = policy.budget if policy is not None else None
    return budget_refusal(job.team, budget, spent.get(job.team, BudgetUse()), job.worst_case_micros)
