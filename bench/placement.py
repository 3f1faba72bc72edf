"""Placement throughput with 100, 1,000 and 10,000 registered workers, measured side by side.

    python bench/placement.py [--queue 20000] [--sizes 100,1000,10000] [--seed 1]
                              [--plane-sizes 1000,10000] [--burst 200] [--changes 10]

Each fleet is a realistic mix: a few dozen hardware/software signatures (CUDA boxes of seven
GPU models with 1 to 8 devices, CPU-only x86 and ARM hosts, Apple hosts), spread over
providers and regions, with pool/team/tier labels. Jobs are mixed: CPU jobs, 1-GPU jobs with
memory or compute-capability floors, multi-GPU jobs, some pinned by label, three strategies.

Three measurements per fleet size:

- choose: one placement decision (``WorkerIndex.choose``) against a fleet about half busy,
  nothing committed, so every decision sees the same load;
- plan: one ``plan_pass`` over a deep queue on an idle fleet, where each queued job is one
  decision and every placement updates the index;
- scan: the same decisions made by judging every worker with the full check chain
  (``place_by_scan``), on a small sample, to show what the index saves and that both agree.

Then the same index live in a running control plane (``ControlService`` over a SQLite file),
against the path that reads every worker and running attempt from the store on every pass
(``LivePlacement(full_every=0)``), each on its own store built from the same seed:

- decisions/s: one pass's decisions over ``--burst`` queued jobs, reads of the store
  included, nothing committed;
- burst: then the dispatch pass that places them, commits included;
- attempt ends: one attempt finishes (``finish_attempt``), and the pass that follows places
  one queued job: the cost of one worker's change;
- re-registers: one worker registers again with new labels, and the pass that follows.

Times are CPU time of this process (``time.process_time``), so other work on a shared machine
inflates them less than wall-clock time would. The ratios compare per-decision cost with the
1,000-worker fleet. Nothing here asserts a timing; the numbers are printed for people to read.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpulayer.control.claim_poll import claim_blocking
from gpulayer.control.dispatch import LivePlacement, plan_assignments
from gpulayer.control.paths import HomeLayout
from gpulayer.control.service import ControlService
from gpulayer.control.store import Store
from gpulayer.protocol.messages import AttemptReport, Registration
from gpulayer.scheduler import QueuedJob, WorkerIndex, WorkerSnapshot, place_by_scan, plan_pass
from gpulayer.spec import JobSpec
from gpulayer.spec.capabilities import GpuDevice, WorkerCapabilities

GPU_MODELS = [
    ("NVIDIA H100 80GB HBM3", 80.0, "9.0"),
    ("NVIDIA A100-SXM4-80GB", 80.0, "8.0"),
    ("NVIDIA A100-SXM4-40GB", 40.0, "8.0"),
    ("NVIDIA A10G", 24.0, "8.6"),
    ("NVIDIA L4", 24.0, "8.9"),
    ("NVIDIA T4", 16.0, "7.5"),
    ("Tesla V100-SXM2-16GB", 16.0, "7.0"),
]
PROVIDERS = [("aws", "us-east-1"), ("aws", "eu-west-1"), ("gcp", "us-central1"), (None, None)]


def signatures(rng: random.Random, count: int = 36) -> list[WorkerCapabilities]:
    """``count`` distinct capability templates: mostly CUDA, some CPU-only and Apple hosts."""
    templates: dict[str, WorkerCapabilities] = {}
    while len(templates) < count:
        provider, region = rng.choice(PROVIDERS)
        roll = rng.random()
        fields: dict[str, Any] = {
            "provider": provider,
            "region": region,
            "python_version": rng.choice(["3.10.14", "3.11.9", "3.12.4"]),
        }
        if roll < 0.7:
            name, memory, capability = rng.choice(GPU_MODELS)
            n = rng.choice([1, 1, 2, 4, 8])
            fields |= {
                "accelerator": "cuda",
                "gpus": [
                    GpuDevice(
                        index=i,
                        name=name,
                        memory_gb=memory,
                        memory_kind="dedicated",
                        compute_capability=capability,
                    )
                    for i in range(n)
                ],
                "cpu_cores": 8 * n,
                "memory_gb": 64.0 * n,
                "disk_gb": 500.0,
                "frameworks": {"torch": rng.choice(["2.3.1", "2.4.0"]), "numpy": "1.26.4"},
                "markers": ["torch.cuda"],
            }
        elif roll < 0.9:
            cores = rng.choice([4, 16, 32, 64])
            fields |= {
                "cpu_cores": cores,
                "memory_gb": 4.0 * cores,
                "disk_gb": 200.0,
                "cpu_arch": rng.choice(["x86_64", "aarch64"]),
                "frameworks": {"torch": "2.4.0", "numpy": "1.26.4"},
            }
        else:
            fields |= {
                "accelerator": "mps",
                "gpus": [
                    GpuDevice(index=0, name="Apple M2 Max", memory_gb=64.0, memory_kind="unified")
                ],
                "cpu_cores": 12,
                "memory_gb": 64.0,
                "os": "darwin",
                "cpu_arch": "aarch64",
                "frameworks": {"torch": "2.4.0", "mlx": "0.16.0"},
                "markers": ["torch.mps"],
                "provider": None,
                "region": None,
            }
        caps = WorkerCapabilities.model_validate(fields)
        templates[caps.model_dump_json()] = caps
    return list(templates.values())


def fleet(
    rng: random.Random, size: int, templates: list[WorkerCapabilities]
) -> list[WorkerSnapshot]:
    weights = [rng.uniform(0.2, 3.0) for _ in templates]
    workers = []
    for i in range(size):
        caps = rng.choices(templates, weights)[0].model_copy(update={"hostname": f"host-{i}"})
        labels = {
            "pool": rng.choice(["batch", "batch", "interactive", "research"]),
            "team": f"team-{rng.randrange(20)}",
        }
        if rng.random() < 0.2:
            labels["tier"] = "gold"
        workers.append(
            WorkerSnapshot(
                id=f"wrk-{rng.getrandbits(48):012x}",
                name=f"host-{i}",
                labels=labels,
                capabilities=caps,
                free_gpus=tuple(g.index for g in caps.gpus),
                free_cpu_cores=float(caps.cpu_cores),
                free_memory_gb=caps.memory_gb,
            )
        )
    return workers


def loaded(
    rng: random.Random, workers: list[WorkerSnapshot], fraction: float
) -> list[WorkerSnapshot]:
    """Each GPU busy with probability ``fraction``; cores and memory busy around it."""
    busy = []
    for w in workers:
        taken = tuple(i for i in w.free_gpus if rng.random() < fraction)
        share = min(1.0, max(0.0, rng.gauss(fraction, 0.25)))
        cores = w.free_cpu_cores * share
        memory = (w.free_memory_gb or 0.0) * share
        busy.append(replace(w.take(taken, cores, memory), running=rng.randrange(1, 5)))
    return busy


def choose_cost(index: WorkerIndex, jobs: list[JobSpec]) -> tuple[float, float]:
    """CPU seconds per decision (best of three) and the share of jobs that found a worker."""
    for spec in jobs[:200]:  # warm the per-shape caches and the sorted orders
        index.choose(spec)
    best = math.inf
    placed = 0
    for _ in range(3):  # other work on the machine only ever adds time
        gc.collect()
        started = time.process_time()
        placed = sum(index.choose(spec) is not None for spec in jobs)
        best = min(best, (time.process_time() - started) / len(jobs))
    return best, placed / len(jobs)


def random_job(rng: random.Random) -> JobSpec:
    roll = rng.random()
    resources: dict[str, Any]
    if roll < 0.45:
        resources = {"cpu_cores": rng.choice([1, 1, 2, 4, 8])}
        if rng.random() < 0.3:
            resources["memory_gb"] = rng.choice([4, 16, 64])
    elif roll < 0.85:
        resources = {"accelerator": "cuda", "cpu_cores": rng.choice([2, 4, 8])}
        if rng.random() < 0.5:
            resources["gpu_memory_gb"] = rng.choice([16, 24, 40, 80])
        if rng.random() < 0.2:
            resources["min_cuda_compute_capability"] = rng.choice(["8.0", "8.6", "9.0"])
    elif roll < 0.95:
        resources = {"accelerator": "cuda", "gpu_count": rng.choice([2, 4]), "cpu_cores": 8}
    elif roll < 0.98:
        resources = {
            "accelerator": "cuda",
            "gpu_count": 8,
            "cpu_cores": 32,
            "gpu_memory_gb": rng.choice([40, 80]),
        }
    else:
        resources = {"profile": "pytorch-mps"}
    if rng.random() < 0.2:
        resources.setdefault("frameworks", {})["torch"] = rng.choice([">=2.3", ">=2.4"])
    placement: dict[str, Any] = {
        "strategy": rng.choice(["spread", "first_fit", "most_free_memory"])
    }
    if rng.random() < 0.2:
        placement["worker_labels"] = {"pool": rng.choice(["batch", "interactive", "research"])}
    elif rng.random() < 0.05:
        placement["worker_labels"] = {"team": f"team-{rng.randrange(20)}"}
    elif rng.random() < 0.05:
        placement["providers"] = ["aws"]
    return JobSpec.model_validate(
        {
            "workload": {"kind": "command", "command": ["python", "train.py"]},
            "resources": resources,
            "placement": placement,
        }
    )


def measure(
    size: int,
    jobs: list[JobSpec],
    queue_jobs: list[JobSpec],
    seed: int,
    templates: list[WorkerCapabilities],
) -> dict[str, float]:
    rng = random.Random(seed + size)
    idle = fleet(rng, size, templates)
    busy = loaded(rng, idle, 0.5)

    gc.collect()  # so garbage from building the fleet is not collected on the clock
    started = time.process_time()
    index = WorkerIndex(busy)
    build = time.process_time() - started

    choose, fit = choose_cost(index, jobs)
    choose_full, fit_full = choose_cost(WorkerIndex(loaded(rng, idle, 0.95)), jobs)

    sample = jobs[: max(5, 20_000 // size)]
    started = time.process_time()
    scanned = [place_by_scan(spec, busy) for spec in sample]
    scan = (time.process_time() - started) / len(sample)
    agree = all(index.choose(s) == p for s, p in zip(sample, scanned, strict=True))

    queue = [QueuedJob(f"job-{i:06d}", spec, float(i)) for i, spec in enumerate(queue_jobs)]
    fresh = WorkerIndex(idle)
    gc.collect()
    started = time.process_time()
    result = plan_pass(queue, fresh, now=float(len(queue)), starvation_seconds=600.0)
    planned = time.process_time() - started
    return {
        "workers": size,
        "groups": index.group_count,
        "build_ms": build * 1e3,
        "choose_us": choose * 1e6,
        "choose_fit": fit,
        "full_us": choose_full * 1e6,
        "full_fit": fit_full,
        "scan_us": scan * 1e6,
        "agree": float(agree),
        "plan_s": planned,
        "plan_us": planned / result.decisions * 1e6,
        "plan_placed": len(result.assignments),
        "plan_us_placed": planned / max(len(result.assignments), 1) * 1e6,
    }


# --- the live index in a running control plane ---------------------------------------------


def _store_fleet(store: Store, workers: list[WorkerSnapshot]) -> None:
    """The fleet's rows in one transaction: registering 10,000 workers one call at a time
    would measure the setup, not placement."""
    from sqlalchemy import insert

    from gpulayer.control import tables

    now = time.time()
    rows = [
        {
            "id": w.id,
            "name": w.name,
            "kind": "remote",
            "labels": json.dumps(dict(w.labels)),
            "capabilities": w.capabilities.model_dump_json(),
            "state": "ready",
            "registered_at": now,
            "last_heartbeat": now,
            "epoch": 1,
        }
        for w in workers
    ]
    with store.engine.begin() as conn:
        conn.execute(insert(tables.workers), rows)


def _queue(store: Store, rng: random.Random, count: int, serial: list[int]) -> list[str]:
    ids = []
    for _ in range(count):
        spec = random_job(rng).model_dump(mode="json")
        spec["placement"]["target"] = "remote"
        serial[0] += 1
        job_id = f"j{serial[0]:07d}"
        store.insert_job(
            job_id=job_id,
            name=job_id,
            spec=spec,
            state="queued",
            target="remote",
            working_dir=None,
            has_bundle=False,
            labels={},
        )
        ids.append(job_id)
    return ids


def _cpu(action: Any) -> float:
    gc.collect()
    started = time.process_time()
    action()
    return time.process_time() - started


def measure_plane(
    size: int,
    seed: int,
    templates: list[WorkerCapabilities],
    *,
    full_every: float,
    burst: int,
    changes: int,
) -> dict[str, float]:
    rng = random.Random(seed + size)
    workers = fleet(rng, size, templates)
    by_id = {w.id: w for w in workers}
    serial = [0]
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{tmp}/state.db")
        _store_fleet(store, workers)
        layout = HomeLayout(Path(tmp) / "home").ensure()
        service = ControlService(
            store,
            layout,
            heartbeat_timeout=1e9,
            placement=LivePlacement(store, full_every=full_every),
        )
        _queue(store, rng, 1, serial)
        service.dispatcher.dispatch()  # the first pass after a start reads everything, on either path

        jobs = _queue(store, rng, burst, serial)
        # The decisions alone: a pass whose answers are not committed (the workers it chose
        # are read again by the next pass, as after any pass).
        decide_s = _cpu(lambda: plan_assignments(store, service.placement))
        burst_s = _cpu(service.dispatcher.dispatch)
        placed = sum(store.get_job(j).state == "running" for j in jobs)

        ends: list[float] = []
        for _ in range(changes):
            _queue(store, rng, 1, serial)
            attempt = rng.choice([a for a in store.active_attempts() if a.worker_id])
            assert attempt.worker_id is not None
            claim_blocking(service.claims, attempt.worker_id, 0)
            report = AttemptReport(state="succeeded", exit_code=0)
            ends.append(_cpu(lambda a=attempt, r=report: service.reports.finish_attempt(a.id, r)))

        registers: list[float] = []
        for i in range(changes):
            _queue(store, rng, 1, serial)
            w = by_id[rng.choice(workers).id]
            registration = Registration(
                name=w.name,
                kind="remote",
                worker_id=w.id,
                labels={**w.labels, "pool": f"moved-{i}"},
                capabilities=w.capabilities.model_dump(mode="json"),
            )
            registers.append(_cpu(lambda r=registration: service.workers.register_worker(r)))
        rejected = service.placement.rejected
        store.close()
    return {
        "decide_s": decide_s,
        "burst_s": burst_s,
        "burst": float(burst),
        "placed": float(placed),
        "end_ms": sorted(ends)[len(ends) // 2] * 1e3,
        "register_ms": sorted(registers)[len(registers) // 2] * 1e3,
        "rejected": float(rejected),
    }


def plane_table(rows: list[tuple[int, dict[str, float], dict[str, float]]], burst: int) -> None:
    body = []
    for size, full, live in rows:
        for name, r in (("read all", full), ("live", live)):
            body.append(
                [
                    f"{size:,}",
                    name,
                    f"{r['burst'] / r['decide_s']:,.0f}",
                    f"{r['burst'] / r['burst_s']:,.0f}",
                    f"{r['placed']:.0f}",
                    f"{r['end_ms']:.1f}",
                    f"{r['register_ms']:.1f}",
                    f"{r['rejected']:.0f}",
                ]
            )
        body.append(
            [
                "",
                "x faster",
                f"{full['decide_s'] / live['decide_s']:.1f}",
                f"{full['burst_s'] / live['burst_s']:.1f}",
                "",
                f"{full['end_ms'] / live['end_ms']:.1f}",
                f"{full['register_ms'] / live['register_ms']:.1f}",
                "",
            ]
        )
    _table(
        f"live index in a running control plane (SQLite file), {burst} queued jobs in a burst; "
        "one worker's change, median",
        [
            "workers",
            "path",
            "decisions/s",
            "burst jobs/s",
            "placed",
            "attempt end ms",
            "re-register ms",
            "dropped",
        ],
        body,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue", type=int, default=20_000)
    parser.add_argument("--decisions", type=int, default=5_000)
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--plane-sizes", default="1000,10000")
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--changes", type=int, default=10)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    rng = random.Random(args.seed)
    templates = signatures(rng)
    plane_rows = []
    for size in (int(s) for s in args.plane_sizes.split(",") if s):
        runs = [
            measure_plane(
                size,
                args.seed,
                templates,
                full_every=full_every,
                burst=args.burst,
                changes=args.changes,
            )
            for full_every in (0.0, 3600.0)
        ]
        plane_rows.append((size, runs[0], runs[1]))
    if not sizes:
        plane_table(plane_rows, args.burst)
        return
    jobs = [random_job(rng) for _ in range(args.decisions)]
    queue_jobs = [random_job(rng) for _ in range(args.queue)]
    rows = [measure(size, jobs, queue_jobs, args.seed, templates) for size in sizes]
    base = next((r for r in rows if r["workers"] == 1000), rows[0])

    print(f"{len(templates)} signatures, CPU time per placement decision\n")
    _table(
        f"single decisions, WorkerIndex.choose ({len(jobs):,} jobs, nothing committed)",
        [
            "workers",
            "groups",
            "build ms",
            "50% busy/s",
            "us",
            "x 1k",
            "fit",
            "95% busy/s",
            "us",
            "x 1k",
            "fit",
            "scan us",
            "same",
        ],
        [
            [
                f"{r['workers']:,}",
                f"{r['groups']}",
                f"{r['build_ms']:.1f}",
                f"{1e6 / r['choose_us']:,.0f}",
                f"{r['choose_us']:.1f}",
                f"{r['choose_us'] / base['choose_us']:.2f}",
                f"{r['choose_fit']:.0%}",
                f"{1e6 / r['full_us']:,.0f}",
                f"{r['full_us']:.1f}",
                f"{r['full_us'] / base['full_us']:.2f}",
                f"{r['full_fit']:.0%}",
                f"{r['scan_us']:,.0f}",
                "yes" if r["agree"] else "NO",
            ]
            for r in rows
        ],
    )
    _table(
        f"deep queue, one plan_pass over {len(queue_jobs):,} queued jobs on an idle fleet",
        ["workers", "decisions/s", "us/decision", "x 1k", "placed", "us/placed", "x 1k"],
        [
            [
                f"{r['workers']:,}",
                f"{1e6 / r['plan_us']:,.0f}",
                f"{r['plan_us']:.1f}",
                f"{r['plan_us'] / base['plan_us']:.2f}",
                f"{r['plan_placed']:,}",
                f"{r['plan_us_placed']:.1f}",
                f"{r['plan_us_placed'] / base['plan_us_placed']:.2f}",
            ]
            for r in rows
        ],
    )
    if plane_rows:
        plane_table(plane_rows, args.burst)


def _table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    print(title)
    print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
    print()


if __name__ == "__main__":
    main()
