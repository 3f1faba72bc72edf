"""A gang's result is node 0's even when its nodes report at the same moment: each node's
result is kept with its ending, so the node that ends the gang reads every result there is.
A real SQLite store, two workers, both nodes' reports sent from two threads at once."""

from __future__ import annotations

import threading
from pathlib import Path

from gpulayer.control.claim_poll import claim_blocking
from gpulayer.control.paths import HomeLayout
from gpulayer.control.service import ControlService
from gpulayer.control.store import Store
from gpulayer.protocol.messages import AttemptReport, Registration
from tests.unit.test_scheduler_builders import caps

GANG_SPEC = {
    "workload": {"kind": "distributed", "entrypoint": "train.py", "num_workers": 2},
    "resources": {"cpu_cores": 2},
    "placement": {"target": "remote"},
}


def plane(tmp_path: Path) -> ControlService:
    layout = HomeLayout(tmp_path / "home").ensure()
    return ControlService(Store(f"sqlite:///{tmp_path / 'state.db'}"), layout)


def register(service: ControlService, name: str) -> str:
    registration = Registration(
        name=name, kind="remote", capabilities=caps(cpu_cores=4).model_dump(mode="json")
    )
    worker, _ = service.workers.register_worker(registration)
    return worker.id


def test_a_gang_whose_nodes_report_together_keeps_node_zeros_result(tmp_path: Path) -> None:
    service = plane(tmp_path)
    workers = [register(service, "g0"), register(service, "g1")]
    for round_number in range(40):
        job = service.submissions.submit(GANG_SPEC).id
        for worker in workers:
            claim_blocking(service.claims, worker, 0)
        nodes = service.store.attempts_for(job)
        assert sorted(a.node_rank for a in nodes) == [0, 1]
        assert all(a.state == "running" for a in nodes), nodes
        start = threading.Barrier(2)
        failures: list[BaseException] = []

        def report(
            attempt_id: int,
            result: dict[str, object],
            start: threading.Barrier = start,
            failures: list[BaseException] = failures,
        ) -> None:
            try:
                start.wait(10)
                service.reports.finish_attempt(
                    attempt_id,
                    AttemptReport(state="succeeded", exit_code=0, result=result),
                    dispatch=False,
                )
            except BaseException as exc:  # carried to the test's own thread
                failures.append(exc)

        threads = [
            threading.Thread(
                target=report,
                args=(a.id, {"value": f"from node {a.node_rank}", "node_rank": a.node_rank}),
            )
            for a in nodes
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert not failures, failures
        record = service.store.get_job(job)
        assert record.state == "succeeded", (round_number, record)
        assert record.result == {"value": "from node 0", "node_rank": 0}, (round_number, record)
