"""Big logs with real server and worker processes: `gpulayer logs` streams (its memory does not
grow with the log), and a per-job cap keeps the newest bytes and marks the cut."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer.control.store import Store
from tests.support.servers import (
    ADMIN_TOKEN,
    ServerProcess,
    WorkerProcess,
    wait_for_job,
    wait_for_workers,
)

CAP = 256 * 1024

# Runs `gpulayer logs` and reports the largest resident size any child reached (ru_maxrss, KiB).
PEAK_RSS = """
import resource, subprocess, sys
with open(sys.argv[1], "wb") as sink:
    code = subprocess.run(sys.argv[2:], stdout=sink, stderr=subprocess.DEVNULL).returncode
print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    home = tmp_path_factory.mktemp("big-logs") / "server"
    process = ServerProcess(home, extra_args=("--max-log-bytes", "256KiB")).start()
    yield process
    process.stop()


def remote_job(argv: list[str]) -> dict[str, object]:
    return {"workload": {"kind": "command", "command": argv}, "placement": {"target": "remote"}}


def fill_log(server: ServerProcess, job_id: str, megabytes: int) -> int:
    """Write a long log straight into the server's store file, as a chatty job would have."""
    store = Store(f"sqlite:///{server.home / 'server.db'}", max_log_bytes=1 << 40)
    line = "x" * 99 + "\n"
    batch = [("stdout", line)] * 5000
    try:
        for _ in range(megabytes * 2):  # 5000 lines of 100 bytes: 0.5 MB a batch
            store.append_logs(job_id, 1, batch)
    finally:
        store.close()
    return megabytes * 2 * 5000


def peak_rss_of_logs(server: ServerProcess, job_id: str, out: Path, *extra: str) -> int:
    command = [sys.executable, "-m", "gpulayer", "logs", job_id, "--server", server.url, *extra]
    result = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, str(out), *command],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "GPULAYER_TOKEN": ADMIN_TOKEN},
    )
    code, peak = result.stdout.split()
    assert code == "0", result.stderr
    return int(peak)


@pytest.mark.slow
def test_logs_streams_in_pages_whatever_the_log_size(server: ServerProcess, tmp_path: Path) -> None:
    client = server.client()
    small = client.submit(remote_job(["true"]))["id"]
    large = client.submit(remote_job(["true"]))["id"]
    small_lines = fill_log(server, small, 3)
    large_lines = fill_log(server, large, 18)

    small_peak = peak_rss_of_logs(server, small, tmp_path / "small.txt")
    large_peak = peak_rss_of_logs(server, large, tmp_path / "large.txt")
    with (tmp_path / "large.txt").open("rb") as printed:
        assert sum(1 for _ in printed) == large_lines
    assert sum(1 for _ in (tmp_path / "small.txt").open("rb")) == small_lines
    # Six times the log, about the same memory: pages, not the whole log, are held.
    assert large_peak - small_peak < 20 * 1024, (small_peak, large_peak)

    json_peak = peak_rss_of_logs(server, large, tmp_path / "large.json", "--json")
    assert json_peak - small_peak < 20 * 1024, (small_peak, json_peak)
    with (tmp_path / "large.json").open("rb") as printed:
        first = [next(printed) for _ in range(3)]
    assert first[0] == b"[\n"
    items = [json.loads(raw.rstrip(b",\n")) for raw in first[1:]]
    assert "x" * 99 + "\n" in [item["text"] for item in items]


def test_a_chatty_job_keeps_the_newest_bytes_under_the_cap(
    server: ServerProcess, tmp_path: Path
) -> None:
    client = server.client()
    token = client.request("POST", "/v1/tokens", {"kind": "worker"})["token"]
    worker = WorkerProcess(server.url, token, tmp_path / "worker", "chatty").start()
    try:
        wait_for_workers(client, 1)
        lines = 20_000  # 2 MB of output, eight times the cap
        script = f"for i in range({lines}): print(f'line {{i:06d}} ' + 'y' * 86)"
        job_id = client.submit(remote_job(["python", "-c", script]))["id"]
        job = wait_for_job(client, job_id, {"succeeded", "failed"}, timeout=120)
        assert job["state"] == "succeeded", (job["reason"], job["message"])
    finally:
        worker.stop()
    kept = list(client.iter_logs(job_id))
    output = [line for line in kept if line["stream"] == "stdout"]
    held = sum(len(line["text"].encode()) for line in kept if line["stream"] != "system")
    assert held <= CAP
    assert held >= CAP * 0.8  # the cut leaves most of the cap in use
    # The newest lines, contiguous up to the very last one the job printed.
    numbers = [int(line["text"].split()[1]) for line in output]
    assert numbers[-1] == lines - 1
    assert numbers == list(range(numbers[0], lines))
    markers = [line for line in kept if "log cut" in line["text"]]
    assert len(markers) == 1 and kept.index(markers[0]) <= 1
    assert markers[0]["stream"] == "system"
    cut = int(markers[0]["text"].split("oldest ")[1].split()[0])
    dropped_output = sum(len(f"line {i:06d} ".encode()) + 87 for i in range(numbers[0]))
    assert 0 <= cut - dropped_output < 4096  # besides the output, only gpulayer's short notes


def test_log_cap_flag_is_checked(tmp_path: Path) -> None:
    from tests.support.cli import run_cli

    result = run_cli(["server", "--max-log-bytes", "lots", "--port", "1"], cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: --max-log-bytes: 'lots' is not a size such as 1GiB, 500MB or 1048576"
    )


CHATTY = """
import sys
import time
total, progress = int(sys.argv[1]), sys.argv[2]
line = "p" * 99 + "\\n"
for i in range(total):
    sys.stdout.write(line)
    if i % 5000 == 0:
        with open(progress, "w") as out:
            out.write(str(i))
with open(progress, "w") as out:
    out.write(str(total))
print("last line")
"""


def rss_kib(pid: int) -> int:
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmRSS:"):
            return int(row.split()[1])
    raise AssertionError("no VmRSS")


def read_progress(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return 0


@pytest.mark.slow
def test_a_job_outprinting_a_stalled_control_plane_is_held_back(tmp_path: Path) -> None:

    server = ServerProcess(
        tmp_path / "server", heartbeat_timeout=300, extra_args=("--max-log-bytes", "1MiB")
    ).start()
    worker = None
    try:
        client = server.client()
        token = client.request("POST", "/v1/tokens", {"kind": "worker"})["token"]
        worker = WorkerProcess(server.url, token, tmp_path / "worker", "held").start()
        wait_for_workers(client, 1)
        total = 400_000  # 40 MB of output
        progress = tmp_path / "progress"
        job_id = client.submit(remote_job(["python", "-c", CHATTY, str(total), str(progress)]))[
            "id"
        ]
        deadline = time.monotonic() + 60
        while read_progress(progress) < 5000:
            assert time.monotonic() < deadline, "the job never started printing"
            time.sleep(0.05)
        assert worker.process is not None
        baseline = rss_kib(worker.process.pid)
        os.killpg(server.process.pid, signal.SIGSTOP)  # type: ignore[union-attr]
        try:
            # Wait for the job to stall: its progress stays put for a while.
            seen, since = read_progress(progress), time.monotonic()
            deadline = time.monotonic() + 60
            while time.monotonic() - since < 3.0:
                assert time.monotonic() < deadline, "the job was never held back"
                time.sleep(0.1)
                now = read_progress(progress)
                if now != seen:
                    seen, since = now, time.monotonic()
            assert seen < total // 2, seen  # held back long before it printed everything
            grown = rss_kib(worker.process.pid) - baseline
            assert grown < 40 * 1024, grown  # the queue is bounded: about 8 MiB of lines
        finally:
            os.killpg(server.process.pid, signal.SIGCONT)  # type: ignore[union-attr]
        job = wait_for_job(client, job_id, {"succeeded", "failed"}, timeout=300)
        assert job["state"] == "succeeded", (job["reason"], job["message"])
        printed = [line for line in client.iter_logs(job_id) if line["stream"] == "stdout"]
        assert printed[-1]["text"] == "last line\n"  # nothing lost at the end
    finally:
        if worker is not None:
            worker.stop()
        server.stop()
