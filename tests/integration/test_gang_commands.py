"""Any command on N nodes (`workload.kind: distributed` with `command`), on two worker processes
on loopback: a launcher script that starts torchrun itself, an all-reduce over plain sockets,
and one node's failure ending the gang."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from gpulayer.protocol.bundle import create_bundle
from gpulayer.protocol.client import ControlClient
from tests.integration.test_gangs import all_lines, rank_reports
from tests.support.servers import free_port, wait_for_job

FIXTURES = Path(__file__).parents[1] / "fixtures"

pytestmark = pytest.mark.slow


def command_gang(command: list[str], *, nodes: int = 2, procs: int = 1) -> dict[str, Any]:
    return {
        "name": "gang-command",
        "workload": {
            "kind": "distributed",
            "command": command,
            "num_workers": nodes,
            "procs_per_worker": procs,
            "rendezvous": {"port": free_port(), "join_timeout_seconds": 60},
        },
        "resources": {"cpu_cores": 1},
        "placement": {"target": "remote", "on_unschedulable": "fail"},
    }


def submit(client: ControlClient, spec: dict[str, Any], tmp: Path) -> str:
    source = tmp / "source"
    shutil.copytree(FIXTURES / "gang_commands", source)
    shutil.copy(FIXTURES / "ddp" / "train.py", source / "train.py")
    bundle = tmp / "source.tar.gz"
    create_bundle(source, bundle)
    return str(client.submit(spec, bundle_id=client.upload_bundle(bundle))["id"])


def test_a_script_that_starts_torchrun_itself_trains_on_two_nodes(
    cluster_factory: Any, tmp_path: Path
) -> None:
    cluster = cluster_factory(2)
    client = cluster.client
    spec = command_gang(["sh", "run_torchrun.sh", "10"], procs=2)
    job_id = submit(client, spec, tmp_path)
    job = wait_for_job(client, job_id, {"succeeded", "failed"}, timeout=180)
    assert job["state"] == "succeeded", (job, all_lines(client, job_id)[-30:])
    assert sorted(a["node_rank"] for a in job["attempts"]) == [0, 1]
    assert len({a["worker_id"] for a in job["attempts"]}) == 2
    reports = rank_reports(all_lines(client, job_id))
    assert sorted(r["rank"] for r in reports) == [0, 1, 2, 3]
    for report in reports:
        assert report["world"] == 4
        assert report["env"]["GPULAYER_NODE_RANK"] == str(report["node"])
        assert report["env"]["MASTER_PORT"] == str(spec["workload"]["rendezvous"]["port"])
        assert report["losses"][-1] < report["losses"][0] / 2


def test_an_all_reduce_over_plain_sockets_sees_every_node(
    cluster_factory: Any, tmp_path: Path
) -> None:
    cluster = cluster_factory(2)
    client = cluster.client
    job_id = submit(client, command_gang(["python", "allreduce.py"]), tmp_path)
    job = wait_for_job(client, job_id, {"succeeded", "failed"}, timeout=120)
    assert job["state"] == "succeeded", (job, all_lines(client, job_id)[-30:])
    reports = {}
    for line in all_lines(client, job_id):
        if line["text"].startswith("ALLREDUCE "):
            reports[line["node"]] = json.loads(line["text"].removeprefix("ALLREDUCE "))
    assert sorted(reports) == [0, 1]
    assert {r["total"] for r in reports.values()} == {10 + 20}
    assert all(r["rank"] == node for node, r in reports.items())
    # The node list names each node's address, in rank order, the same on every node.
    lists = {r["nodes"] for r in reports.values()}
    assert len(lists) == 1 and len(lists.pop().split(",")) == 2


def test_one_nodes_failure_ends_every_node(cluster_factory: Any, tmp_path: Path) -> None:
    cluster = cluster_factory(2)
    client = cluster.client
    job_id = submit(client, command_gang(["sh", "fail_on_one.sh"]), tmp_path)
    started = time.monotonic()
    job = wait_for_job(client, job_id, {"succeeded", "failed"}, timeout=120)
    assert job["state"] == "failed"
    assert "node 1" in job["message"] and "3" in job["message"], job["message"]
    assert time.monotonic() - started < 100  # node 0's ten minutes were cut short
    assert all(a["state"] in ("failed", "cancelled") for a in client.job(job_id)["attempts"])
