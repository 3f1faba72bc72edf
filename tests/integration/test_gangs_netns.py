"""A 2 x 2 DDP gang whose two workers run in network namespaces, each at its own address:
the nodes meet at node 0's address and talk over each namespace's own interface."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from tests.integration.test_gangs import all_lines, ddp_job, rank_reports, submit_with_source
from tests.support.servers import ServerProcess, free_port, wait_for_job, wait_for_workers
from tests.support.sshd_hosts import SshdHost, SshdLab, netns_usable

pytestmark = pytest.mark.slow


@pytest.fixture
def netns_lab(tmp_path: Path) -> Iterator[SshdLab]:
    # Workers here run this machine's interpreter, so their hosts share its files ("netns"),
    # whichever mode other tests' hosts take.
    if not netns_usable():
        pytest.skip("network namespaces need root, iproute2 and unshare")
    lab = SshdLab.create(tmp_path / "lab", "netns")
    try:
        yield lab
    finally:
        lab.close()


def start_worker(lab: SshdLab, host: SshdHost, url: str, token: str, home: Path) -> Any:
    home.mkdir(parents=True, exist_ok=True)
    token_file = home / "join.token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    argv = [
        sys.executable, "-m", "gpulayer", "worker", "start", "--server", url,
        "--token-file", str(token_file), "--name", host.name, "--heartbeat-seconds", "0.5",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("GPULAYER_SERVER", "GPULAYER_TOKEN")}
    env["GPULAYER_HOME"] = str(home)
    env["NO_PROXY"] = f"{env.get('NO_PROXY', '')},{lab.gateway}".strip(",")
    log = (home / "worker.log").open("ab")
    try:
        return subprocess.Popen(
            lab.wrap(host, argv), stdout=log, stderr=log, env=env, start_new_session=True
        )
    finally:
        log.close()


def test_a_gang_across_two_namespaces(netns_lab: SshdLab, tmp_path: Path) -> None:
    lab = netns_lab
    hosts = [lab.add_host(f"gang{i}", start=False) for i in range(2)]
    server = ServerProcess(tmp_path / "server", host=lab.gateway, port=free_port()).start()
    workers: list[subprocess.Popen[bytes]] = []
    try:
        client = server.client()
        token = client.request("POST", "/v1/tokens", {"kind": "worker"})["token"]
        for i, host in enumerate(hosts):
            workers.append(start_worker(lab, host, server.url, token, tmp_path / f"w{i}"))
        registered = wait_for_workers(client, 2)
        # Each worker found its own address on the route to the control plane.
        addresses = {w["capabilities"]["address"] for w in registered}  # type: ignore[index]
        assert addresses == {h.address for h in hosts}
        job_id = submit_with_source(client, ddp_job(["20"]), tmp_path)
        job = wait_for_job(client, job_id, {"succeeded", "failed"}, timeout=180)
        lines = all_lines(client, job_id)
        assert job["state"] == "succeeded", (job, lines[-30:])
        reports = rank_reports(lines)
        assert sorted(r["rank"] for r in reports) == [0, 1, 2, 3]
        attempts = cast("list[dict[str, Any]]", job["attempts"])
        by_rank = {a["node_rank"]: a["worker_name"] for a in attempts}
        leader = next(h for h in hosts if h.name == by_rank[0])
        for report in reports:
            assert report["world"] == 4
            assert report["env"]["MASTER_ADDR"] == leader.address
            # Not loopback: gloo runs over the namespace's own veth.
            assert report["env"]["GLOO_SOCKET_IFNAME"] not in (None, "lo")
            assert report["losses"][-1] < report["losses"][0] / 2
        # Node r runs torch's group r whichever node joined first: rank 0 is node 0's.
        assert {r["rank"]: r["node"] for r in reports} == {0: 0, 1: 0, 2: 1, 3: 1}
        assert any(f"--master-addr={leader.address} " in line["text"] for line in lines)
    finally:
        for worker in workers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGTERM)
        for worker in workers:
            try:
                worker.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(timeout=10)
        server.stop()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(lab.pids_of(h) for h in hosts):
        time.sleep(0.2)
    assert not [p for h in hosts for p in lab.pids_of(h)]
