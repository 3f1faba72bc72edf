"""What the lifecycle's loop costs the controller, without any machine: one pass's decisions
over many live instances, and one recorded transition. Part of bench/lifecycle.py's output;
runs alone too:

    python bench/lifecycle_decisions.py [--instances 1000] [--transitions 500]

The store is a real SQLite file; a pass is timed in its two halves as the reconciler runs
them: gathering every instance's facts from the store, and the one pure decision over the
world (decide_pass: every instance's actions, the jobs to plan, the follow-ups; no step runs,
and no link is open). The pass also reads the jobs waiting for a machine and their waits for
capacity, as it did before the decision became one: that read is shown on a row of its own.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpulayer.cloud.lifecycle.sync import Local, gather
from gpulayer.cloud.lifecycle.world import Live, World, decide_pass
from gpulayer.control.store import Store

# A spread of live states as a busy controller holds them.
STATES = ("requested", "launching", "booting", "bootstrapping", "ready", "in_use", "draining")
SPEC = {"workload": {"kind": "command", "command": ["true"]}, "placement": {"target": "cloud"}}


def _fill(store: Store, count: int) -> None:
    store.insert_jobs(
        [
            {
                "job_id": f"j-{i:05d}",
                "name": f"job{i}",
                "spec": SPEC,
                "state": "provisioning",
                "target": "cloud",
                "working_dir": None,
                "has_bundle": False,
                "labels": {},
            }
            for i in range(count)
        ]
    )
    rows: list[dict[str, Any]] = []
    for i in range(count):
        rows.append(
            {
                "request_id": f"r-{i:05d}",
                "job_id": f"j-{i:05d}",
                "owner": "o-bench",
                "provider": "ssh",
                "state": STATES[i % len(STATES)],
                "tags": {},
                "offer": {"provider": "ssh", "region": "lab", "instance_type": f"box{i}"},
            }
        )
    store.record_instances(rows, reason="bench")
    for i in range(count):
        if STATES[i % len(STATES)] in ("ready", "in_use"):
            worker = f"w-{i:05d}"
            store.upsert_worker(
                worker_id=worker, name=worker, kind="remote", labels={}, capabilities={}
            )
            store.bind_reservation(f"r-{i:05d}", worker)


def measure_pass(base: Path, count: int) -> dict[str, float]:
    """CPU seconds of one pass's two halves over ``count`` live instances."""
    store = Store(f"sqlite:///{base / 'pass.db'}")
    try:
        _fill(store, count)
        now = time.time()
        # As the pass reads them: the jobs waiting for a machine first, then the instances.
        started_waiting = time.process_time()
        jobs = [*store.queued_jobs(), *store.list_jobs(states=["provisioning"], limit=10_000)]
        waiting = [(j.id, j.target) for j in jobs]
        waits = store.capacity_waits()
        started = time.process_time()
        records = store.list_instances(live_only=True)
        leased = store.leased_keys(now)  # the steps in flight, as a pass reads them
        facts = gather(store, records, now, {}, Local(leased.__contains__, lambda rid: False))
        live = [Live(r.request_id, r.job_id, f) for r, f in zip(records, facts, strict=True)]
        world = World(live, waiting, waits, {}, 600.0)
        gathered = time.process_time()
        decision = decide_pass(world, now)
        decided = time.process_time()
        assert len(decision.instances) + len(decision.follow_ups) == len(live)
    finally:
        store.close()
    return {
        "gather": gathered - started,
        "waiting": started - started_waiting,
        "decide": decided - gathered,
        "count": len(facts),
    }


def measure_transitions(base: Path, count: int) -> float:
    """CPU seconds per recorded transition (checked, conditional UPDATE, history row)."""
    store = Store(f"sqlite:///{base / 'moves.db'}")
    try:
        _fill(store, count)
        moves = [
            (r.request_id, r.state)
            for r in store.list_instances(live_only=True)
            if r.state == "requested"
        ]
        started = time.process_time()
        for request_id, state in moves:
            store.move_instance(request_id, expect=state, to="launching", reason="bench")
        return (time.process_time() - started) / max(len(moves), 1)
    finally:
        store.close()


def report(instances: int, transitions: int) -> None:
    with tempfile.TemporaryDirectory(prefix="gpulayer-bench-decisions-") as scratch:
        base = Path(scratch)
        one_pass = measure_pass(base, instances)
        per_move = measure_transitions(base, transitions * len(STATES))
    n = one_pass["count"]
    total = one_pass["gather"] + one_pass["decide"]
    print(f"{f'one lifecycle pass over {n:.0f} live instances':<44}{'CPU ms':>10}{'share':>14}")
    for label, value in (
        ("gathering facts (store reads)", one_pass["gather"]),
        ("deciding (pure)", one_pass["decide"]),
    ):
        print(f"  {label:<42}{value * 1000:>10.1f}{value / total:>13.2f}x")
    print(f"  {'per instance, in all':<42}{total / n * 1000:>10.3f}")
    print(f"  {'(beside: reading the waiting jobs)':<42}{one_pass['waiting'] * 1000:>10.1f}")
    print(f"{'one transition (move + history row)':<44}{'CPU ms':>10}{'vs decide':>14}")
    per_decision = one_pass["decide"] / n
    print(f"  {'SQLite file':<42}{per_move * 1000:>10.3f}{per_move / per_decision:>13.0f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--instances", type=int, default=1000)
    parser.add_argument("--transitions", type=int, default=100, help="per state spread")
    args = parser.parse_args()
    report(args.instances, args.transitions)


if __name__ == "__main__":
    main()
