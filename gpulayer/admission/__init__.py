"""Who goes first and who may start at all: the team queue's pure core.

Ordering (priority, then fair share, then submit time), quota admission with borrowing and
budget admission with reservations. Nothing here reads a clock, a store or the network: the
control plane hands in a snapshot and stores what comes back.
"""

from gpulayer.admission.budgets import (
    Budget,
    BudgetUse,
    Period,
    budget_refusal,
    period_start,
    worst_case_micros,
)
from gpulayer.admission.fair_share import ShareLedger, UsageCharge, dominant_share
from gpulayer.admission.order import AdmissionPass, Waiting, WaitingJob, admit_pass
from gpulayer.admission.quotas import (
    ALL_TARGETS,
    Demand,
    Holdings,
    Quota,
    QuotaVerdict,
    quota_verdict,
)
from gpulayer.admission.teams import TeamPolicy

__all__ = [
    "ALL_TARGETS",
    "AdmissionPass",
    "Budget",
    "BudgetUse",
    "Demand",
    "Holdings",
    "Period",
    "Quota",
    "QuotaVerdict",
    "ShareLedger",
    "TeamPolicy",
    "UsageCharge",
    "Waiting",
    "WaitingJob",
    "admit_pass",
    "budget_refusal",
    "dominant_share",
    "period_start",
    "quota_verdict",
    "worst_case_micros",
]
