"""One scheduling pass of the team queue: 10,000 queued jobs from 50 teams, 1,000 workers.

    python bench/queue.py [--jobs 10000] [--teams 50] [--workers 1000] [--seed 1] [--repeat 3]

The queue is ordered and admitted by the team rules (priority, then fair share over a month of
decaying usage, then quotas with cohort borrowing and dollar budgets), and the admitted jobs
are placed in that order on a fleet about half busy. Printed side by side:

- admission: ``admit_pass`` alone, and its decisions per second;
- placement: ``plan_pass`` over the admitted jobs in admission order;
- one pass: both, against placing the same queue first in, first out with no team rules, so
  the ratio is what the team rules add to a pass.

CPU time of this process (best of ``--repeat``), so other work on a shared machine inflates it
less than wall time would. Nothing is asserted; the figures are printed for people to read.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.placement import fleet, loaded, random_job, signatures
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
from gpulayer.scheduler import QueuedJob, WorkerIndex, plan_pass

NOW = 1_800_000_000.0
MONTH = 30 * 86400.0


def teams(rng: random.Random, count: int) -> dict[str, TeamPolicy]:
    made = {}
    for i in range(count):
        name = f"team-{i}"
        gpus = rng.choice([8, 16, 32, 64])
        quota = Quota(
            {
                (ALL_TARGETS, "gpus"): gpus,
                (ALL_TARGETS, "jobs"): gpus * 4,
                ("aws", "gpus"): gpus // 2,
            },
            {(ALL_TARGETS, "gpus"): gpus // 2},
        )
        budget = Budget(rng.choice([500, 2000, 10000]) * 1_000_000, Period.MONTH)
        made[name] = TeamPolicy(
            name, quota, budget, cohort=f"cohort-{i % 5}", weight=rng.choice([1.0, 2.0])
        )
    return made


def queue(rng: random.Random, jobs: int, names: list[str]) -> list[tuple[WaitingJob, QueuedJob]]:
    made = []
    for i in range(jobs):
        spec = random_job(rng)
        gpus = (spec.resources.gpu_count or 1) if spec.resources.accelerator == "cuda" else 0
        at = NOW - rng.uniform(0, 3600)
        job_id = f"job-{i:05d}"
        waiting = WaitingJob(
            job_id,
            rng.choice(names),
            rng.choice([10, 50, 50, 50, 90]),
            at,
            Demand(rng.choice(["owned", "owned", "aws", "slurm:hpc"]), gpus=gpus),
            cpus=float(spec.resources.cpu_cores),
            worst_case_micros=rng.randrange(0, 20_000_000) if gpus else 0,
        )
        made.append((waiting, QueuedJob(job_id, spec, at)))
    return made


def best_cpu(action: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    best = float("inf")
    result = None
    for _ in range(repeat):
        gc.collect()
        started = time.process_time()
        result = action()
        best = min(best, time.process_time() - started)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--teams", type=int, default=50)
    parser.add_argument("--workers", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    policies = teams(rng, args.teams)
    names = list(policies)
    items = queue(rng, args.jobs, names)
    waiting = [w for w, _ in items]
    by_id = {q.job_id: q for _, q in items}
    workers = loaded(rng, fleet(rng, args.workers, signatures(rng)), 0.5)
    running = [(rng.choice(names), Demand("owned", gpus=rng.choice([1, 2, 4]))) for _ in range(400)]
    charges = [
        UsageCharge(
            rng.choice(names),
            NOW - rng.uniform(0, MONTH),
            gpu_seconds=rng.uniform(0, 4e5),
            cpu_seconds=rng.uniform(0, 1e6),
            spend_micros=rng.uniform(0, 5e8),
        )
        for _ in range(5_000)
    ]
    spent = {name: BudgetUse(rng.randrange(0, 400) * 1_000_000) for name in names}

    def admission() -> Any:
        ledger = ShareLedger(charges, now=NOW, weights={n: t.weight for n, t in policies.items()})
        return admit_pass(waiting, policies, Holdings.of(running), spent, ledger)

    admit_s, admitted = best_cpu(admission, args.repeat)
    ordered = [by_id[job_id] for job_id in admitted.admitted]
    place_s, placed = best_cpu(
        lambda: plan_pass(ordered, WorkerIndex(workers), now=NOW, in_given_order=True), args.repeat
    )
    whole_s, _ = best_cpu(
        lambda: plan_pass(
            [by_id[j] for j in admission().admitted],
            WorkerIndex(workers),
            now=NOW,
            in_given_order=True,
        ),
        args.repeat,
    )
    fifo_s, fifo = best_cpu(
        lambda: plan_pass([q for _, q in items], WorkerIndex(workers), now=NOW), args.repeat
    )
    rows = [
        (
            "admission (order, quotas, budgets)",
            admit_s,
            f"{len(waiting) / admit_s:,.0f} decisions/s",
        ),
        ("placement of the admitted, in order", place_s, f"{len(placed.assignments):,} placed"),
        ("one pass: admission + placement", whole_s, f"{whole_s / fifo_s:.2f}x first-in-first-out"),
        ("first in, first out, no team rules", fifo_s, f"{len(fifo.assignments):,} placed"),
    ]
    print(
        f"{args.jobs:,} queued jobs from {args.teams} teams, {args.workers:,} workers about half busy; "
        f"{len(admitted.admitted):,} admitted, {len(admitted.held_back):,} held back by quota or budget"
    )
    width = max(len(r[0]) for r in rows)
    for label, seconds, note in rows:
        print(f"  {label:<{width}}  {seconds * 1000:8.1f} ms CPU   {note}")


if __name__ == "__main__":
    main()
