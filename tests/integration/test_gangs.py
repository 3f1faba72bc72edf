"""Multi-node jobs on two worker processes on loopback: a 2 x 2 DDP gang with gloo, its
logs and outputs per node, a node killed mid-run, and gangs that can never run refused."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from gpulayer.protocol.bundle import create_bundle
from gpulayer.protocol.client import ControlClient
from tests.support.servers import free_port, wait_for_job

DDP_SOURCE = Path(__file__).parents[1] / "fixtures" / "ddp"

pytestmark = pytest.mark.slow


def ddp_job(args: list[str], *, nodes: int = 2, timeout: float | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "ddp",
        "workload": {
            "kind": "distributed",
            "entrypoint": "train.py",
            "args": args,
            "num_workers": nodes,
            "procs_per_worker": 2,
            "comm_backend": "gloo",
            "rendezvous": {"port": free_port(), "join_timeout_seconds": 60},
        },
        "resources": {"cpu_cores": 1},
        "placement": {"target": "remote", "on_unschedulable": "fail"},
    }
    if timeout is not None:
        spec["timeout_seconds"] = timeout
    return spec


def submit_with_source(client: ControlClient, spec: dict[str, Any], tmp: Path) -> str:
    bundle = tmp / "source.tar.gz"
    create_bundle(DDP_SOURCE, bundle)
    return str(client.submit(spec, bundle_id=client.upload_bundle(bundle))["id"])


def all_lines(client: ControlClient, job_id: str, node: int | None = None) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    after = 0
    while True:
        page = client.logs(job_id, after=after, node=node)["lines"]
        if not page:
            return lines
        lines.extend(page)
        after = page[-1]["id"]


def rank_reports(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    for line in lines:
        text = line["text"]
        if text.startswith("RANKINFO "):
            found.append({**json.loads(text[len("RANKINFO ") :]), "node": line.get("node")})
    return found


def test_two_nodes_of_two_processes_train_together(cluster_factory: Any, tmp_path: Path) -> None:
    cluster = cluster_factory(2)
    client = cluster.client
    job_id = submit_with_source(client, ddp_job(["20"]), tmp_path)
    job = wait_for_job(client, job_id, {"succeeded", "failed"}, timeout=180)
    assert job["state"] == "succeeded", (job, all_lines(client, job_id)[-30:])
    attempts = job["attempts"]
    assert sorted(a["node_rank"] for a in attempts) == [0, 1]
    assert len({a["worker_id"] for a in attempts}) == 2
    assert {a["number"] for a in attempts} == {1}
    reports = rank_reports(all_lines(client, job_id))
    assert sorted(r["rank"] for r in reports) == [0, 1, 2, 3]
    for report in reports:
        env = report["env"]
        assert report["world"] == 4 and env["WORLD_SIZE"] == "4"
        assert env["GPULAYER_NUM_NODES"] == "2"
        assert env["GPULAYER_NODE_RANK"] == str(report["node"])
        assert env["GLOO_SOCKET_IFNAME"] == "lo"
        assert report["losses"][-1] < report["losses"][0] / 2
    # Each node's lines carry its node rank, and --node filters by it.
    node_one = all_lines(client, job_id, node=1)
    assert node_one and all(line["node"] == 1 for line in node_one)
    assert {r["node"] for r in rank_reports(node_one)} == {1}
    paths = {a["path"] for a in client.artifacts(job_id)}
    assert {"node.txt", "node-1/node.txt"} <= paths
    assert not any(p.startswith("node-0/") for p in paths)
    # torch numbers the ranks itself: rank 0's checkpoint lies with the node that ran it.
    leader = next(r["node"] for r in reports if r["rank"] == 0)
    checkpoint = ("" if leader == 0 else f"node-{leader}/") + "checkpoint/model.pt"
    assert checkpoint in paths
    client.download_artifact(job_id, checkpoint, tmp_path / "model.pt")
    import torch

    state = torch.load(tmp_path / "model.pt")
    assert tuple(state["weight"].shape) == (1, 4)
    client.download_artifact(job_id, "node-1/node.txt", tmp_path / "node1.txt")
    assert (tmp_path / "node1.txt").read_text() == "1"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _pids_of(work: Path) -> list[int]:
    return [int(p.read_text()) for p in work.rglob("output/pids/*") if p.read_text().strip()]


def test_a_node_killed_mid_run_ends_the_whole_gang(cluster_factory: Any, tmp_path: Path) -> None:
    cluster = cluster_factory(2, heartbeat_timeout=3.0)
    client = cluster.client
    job_id = submit_with_source(client, ddp_job(["600", "slow"]), tmp_path)
    deadline = time.monotonic() + 120
    pids: list[int] = []
    while time.monotonic() < deadline and len(pids) < 4:
        pids = _pids_of(cluster.base)
        time.sleep(0.2)
    assert len(pids) == 4, all_lines(client, job_id)[-20:]
    job = client.job(job_id)
    by_rank = {a["node_rank"]: a for a in job["attempts"]}
    victim_name = by_rank[1]["worker_name"]
    victim = next(w for w in cluster.workers if w.name == victim_name)
    victim.kill_everything()
    ended = time.monotonic()
    job = wait_for_job(client, job_id, {"failed", "succeeded"}, timeout=60)
    assert job["state"] == "failed"
    assert "node " in job["message"] and "(worker " in job["message"], job["message"]
    # Every rank's process, on both nodes, is gone within seconds.
    while time.monotonic() - ended < 30 and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)]
    assert all(a["state"] in ("failed", "cancelled") for a in client.job(job_id)["attempts"])


def test_more_nodes_than_workers_is_refused_at_submit(cluster_factory: Any, tmp_path: Path) -> None:
    cluster = cluster_factory(2)
    client = cluster.client
    refused = client.job(submit_with_source(client, ddp_job(["1"], nodes=3), tmp_path))
    assert (refused["state"], refused["reason"]) == ("failed", "unschedulable")
    assert "num_workers: 3 nodes need 3 distinct workers; 2 could run one" in refused["message"]
    assert refused["attempts"] == []
    queued = ddp_job(["1"], nodes=3)
    queued["placement"]["on_unschedulable"] = "queue"
    job_id = submit_with_source(client, queued, tmp_path)
    job = client.job(job_id)
    assert job["state"] == "queued"
    assert "2 of 3 nodes fit now" in job["waiting_for"]
    client.cancel(job_id)
