"""400 jobs from 20 concurrent submitters (GPULAYER_TEST_JOBS_EACH=50 makes it 1,000), all from
a source directory a file is being appended to, through the on-demand local control plane they
race to start: every job runs exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from gpulayer.sdk.connection import connect
from tests.support.daemon import stop_local_control_plane

SUBMITTERS = 20
JOBS_EACH = int(os.environ.get("GPULAYER_TEST_JOBS_EACH", "20"))

SUBMITTER = """
import json, sys
from gpulayer.sdk.connection import connect
from gpulayer.sdk.submission import send_job

spec = json.loads(sys.argv[1])
connection = connect()
ids, warnings = [], []
for _ in range(int(sys.argv[2])):
    job = send_job(connection, spec)
    ids.append(job["id"])
    warnings += job.get("warnings", [])
print(json.dumps({"ids": ids, "warnings": warnings}))
"""

APPENDER = """
import itertools, sys, time
with open(sys.argv[1], "a", buffering=1) as out:
    for n in itertools.count():
        out.write(f"step {n} loss 0.{n % 997:03d}\\n")
        time.sleep(0.005)
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_hundreds_of_jobs_from_a_busy_directory_each_run_once(
    tmp_path: Path, shared_home: Path
) -> None:
    stop_local_control_plane(shared_home)
    source = tmp_path / "project"
    (source / "pkg").mkdir(parents=True)
    (source / "train.py").write_text("print('train')\n")
    (source / "pkg" / "__init__.py").write_text("")
    ran = tmp_path / "ran.txt"  # outside the source: each job appends its own id once
    spec = {
        "workload": {
            "kind": "command",
            "command": ["sh", "-c", f'test -f train.py && echo "$GPULAYER_JOB_ID" >> {ran}'],
            "source": str(source),
        },
        "resources": {"cpu_cores": 0.25},
        "placement": {"target": "local"},
    }
    appender = subprocess.Popen([sys.executable, "-c", APPENDER, str(source / "train.log")])
    submitters: list[subprocess.Popen[str]] = []
    try:
        env = {**os.environ, "GPULAYER_IDLE_SECONDS": "120"}
        for _ in range(SUBMITTERS):
            submitters.append(
                subprocess.Popen(
                    [sys.executable, "-c", SUBMITTER, json.dumps(spec), str(JOBS_EACH)],
                    cwd=source,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        submitted: list[str] = []
        for process in submitters:
            out, err = process.communicate(timeout=600)
            assert process.returncode == 0, err[-2000:]
            assert "Traceback" not in err
            submitted += json.loads(out)["ids"]
    finally:
        for process in submitters:
            if process.poll() is None:
                process.kill()
        appender.kill()
        appender.wait(timeout=10)

    assert len(submitted) == len(set(submitted)) == SUBMITTERS * JOBS_EACH
    client = connect().client
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        live = client.jobs(limit=10_000, states=["queued", "provisioning", "running"])
        if not live:
            break
        time.sleep(1.0)
    jobs = client.jobs(limit=10_000)
    states = Counter(j["state"] for j in jobs if j["id"] in set(submitted))
    assert states == {"succeeded": len(submitted)}, states
    ran_ids = ran.read_text().split()
    assert Counter(ran_ids) == Counter(submitted)  # each once, none twice, none missing
    stop_local_control_plane(shared_home)
