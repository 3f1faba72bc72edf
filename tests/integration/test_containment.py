"""No process of a job outlives its attempt: escaping daemons end on cancel, timeout and exit,
under a cgroup v2 per attempt and under the subreaper fallback; a restarted worker sweeps what
its previous life left."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer.spec import JobSpec
from gpulayer.worker import containment as containment_module
from gpulayer.worker.containment import Containment, cgroup2_mount
from gpulayer.worker.runner import JobRun, RunContext
from tests.support.procs import wait_until

# Each escape writes the escaped process's pid to $PIDS/<name> and the job then waits.
_PY_DOUBLE_FORK = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open(os.path.join(os.environ["PIDS"], "daemon"), "w").write(str(os.getpid()))
        time.sleep(300)
    os._exit(0)
time.sleep(300)
"""
_PY_IGNORES_TERM = """
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() == 0:
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(os.path.join(os.environ["PIDS"], "daemon"), "w").write(str(os.getpid()))
    time.sleep(300)
time.sleep(300)
"""
ESCAPES = {
    "setsid double fork": ["python", "-c", _PY_DOUBLE_FORK],
    "setsid -f": [
        "sh",
        "-c",
        "setsid -f sh -c 'echo $$ > \"$PIDS/daemon\"; exec sleep 300'; sleep 300",
    ],
    "nohup and disown": [
        "sh",
        "-c",
        'nohup sleep 300 >/dev/null 2>&1 & echo $! > "$PIDS/daemon"; sleep 300',
    ],
    "ignores SIGTERM in its own session": ["python", "-c", _PY_IGNORES_TERM],
    # With its environment wiped, only the cgroup still knows where it belongs.
    "env -i setsid": [
        "sh",
        "-c",
        'env -i PIDS="$PIDS" setsid -f sh -c \'echo $$ > "$PIDS/daemon"; exec sleep 300\'; '
        "sleep 300",
    ],
}
CGROUP_ONLY = {"env -i setsid"}


def cgroup_usable() -> bool:
    mount = cgroup2_mount()
    if mount is None or os.geteuid() != 0:
        return False
    probe = mount / "gpulayer" / f"probe-{secrets.token_hex(3)}"
    try:
        probe.mkdir(parents=True)
    except OSError:
        return False
    usable = (probe / "cgroup.kill").exists()
    probe.rmdir()
    return usable


MODES = [
    "subreaper",
    pytest.param(
        "cgroup", marks=pytest.mark.skipif(not cgroup_usable(), reason="no writable cgroup v2 here")
    ),
]


@pytest.fixture(params=MODES)
def containment(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Containment]:
    made = Containment.for_worker(tmp_path / "work", allow_cgroup=request.param == "cgroup")
    assert made.mode == request.param
    yield made
    made.sweep()
    if made.root is not None:
        made.root.rmdir()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def start_escape(
    containment: Containment, tmp_path: Path, argv: list[str], attempt_id: int, **spec: object
) -> tuple[JobRun, threading.Thread, Path, dict[str, object]]:
    pids = tmp_path / f"pids-{attempt_id}"
    pids.mkdir()
    job = JobSpec.model_validate(
        {"workload": {"kind": "command", "command": argv}, "env": {"PIDS": str(pids)}, **spec}
    )
    group = containment.attempt(attempt_id)
    context = RunContext(
        "job-1",
        attempt_id,
        job,
        tmp_path / f"attempt-{attempt_id}",
        group=group,
        kill_grace_seconds=1.0,
    )
    run = JobRun(context, on_log=lambda stream, text: None)
    result: dict[str, object] = {}
    thread = threading.Thread(target=lambda: result.update(outcome=run.run()), daemon=True)
    thread.start()
    wait_until(
        lambda: (pids / "daemon").exists() and (pids / "daemon").read_text().strip(),
        30,
        "the daemon started",
    )
    return run, thread, pids, result


@pytest.mark.slow
@pytest.mark.parametrize("escape", sorted(ESCAPES))
@pytest.mark.parametrize("ending", ["cancel", "timeout"])
def test_escaped_daemons_end_with_their_attempt(
    containment: Containment, tmp_path: Path, escape: str, ending: str
) -> None:
    if escape in CGROUP_ONLY and containment.mode != "cgroup":
        pytest.skip("a process that wipes its environment is found by its cgroup only")
    # A short grace: a daemon that ignores SIGTERM is killed once it is over (30 s by default).
    spec: dict[str, object] = {"grace_seconds": 2}
    if ending == "timeout":
        spec["timeout_seconds"] = 4
    run, thread, pids, result = start_escape(containment, tmp_path, ESCAPES[escape], 7, **spec)
    daemon = int((pids / "daemon").read_text())
    assert alive(daemon)
    if ending == "cancel":
        run.cancel()
    thread.join(60)
    assert not thread.is_alive()
    outcome = result["outcome"]
    assert outcome.reason == ("cancelled" if ending == "cancel" else "timeout")  # type: ignore[attr-defined]
    wait_until(lambda: not alive(daemon), 10, f"{escape}: daemon {daemon} outlived the attempt")


@pytest.mark.slow
def test_a_restarted_worker_ends_what_its_previous_life_left(
    containment: Containment, tmp_path: Path
) -> None:
    _, thread, pids, _ = start_escape(containment, tmp_path, ESCAPES["setsid double fork"], 8)
    daemon = int((pids / "daemon").read_text())
    # The worker "dies" without ending anything: a new one on the same work dir sweeps.
    again = Containment.for_worker(tmp_path / "work", allow_cgroup=containment.mode == "cgroup")
    assert again.key == containment.key
    assert again.sweep() >= 1
    wait_until(lambda: not alive(daemon), 10, "the previous life's daemon survived the sweep")
    thread.join(30)


@pytest.mark.slow
def test_the_sentinel_ends_the_attempts_of_a_worker_killed_with_9(tmp_path: Path) -> None:
    """A separate worker-like process owns the attempt; kill -9 it and the sentinel acts."""
    marker_dir = tmp_path / "pids"
    marker_dir.mkdir()
    script = f"""
import sys, time, threading
from pathlib import Path
from gpulayer.spec import JobSpec
from gpulayer.worker.containment import Containment
from gpulayer.worker.runner import JobRun, RunContext
c = Containment.for_worker(Path({str(tmp_path / "work")!r}))
c.start_sentinel()
job = JobSpec.model_validate({{"workload": {{"kind": "command", "command": ["python", "-c", {_PY_DOUBLE_FORK!r}]}}, "env": {{"PIDS": {str(marker_dir)!r}}}}})
run = JobRun(RunContext("job-1", 1, job, Path({str(tmp_path / "attempt")!r}), group=c.attempt(1)), on_log=lambda s, t: None)
print("ready", flush=True)
run.run()
"""
    worker = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert worker.stdout is not None and worker.stdout.readline().strip() == b"ready"
        wait_until(
            lambda: (marker_dir / "daemon").exists() and (marker_dir / "daemon").read_text(),
            30,
            "daemon up",
        )
        daemon = int((marker_dir / "daemon").read_text())
        worker.kill()
        worker.wait(10)
        wait_until(lambda: not alive(daemon), 15, "the daemon outlived its worker's kill -9")
    finally:
        if worker.poll() is None:
            worker.kill()
        containment_module.end_all(containment_module.worker_key(tmp_path / "work"), None)


# A job run as another user looks for any descriptor it was handed and tries to move a root
# process into whatever cgroup it leads to.
_MOVE_ROOT_PROCESS = """
import json, os, sys
victim = sys.argv[1]
held, moved = [], []
for fd in range(3, 1024):
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        continue
    held.append(target)
    try:
        os.write(fd, victim.encode())
        moved.append(target)
    except OSError:
        pass
print("FDS " + json.dumps({"held": held, "moved": moved}), flush=True)
"""


@pytest.mark.slow
@pytest.mark.skipif(not cgroup_usable(), reason="needs a writable cgroup v2 and root")
def test_a_job_run_as_another_user_holds_no_descriptor_and_moves_no_root_process() -> None:
    from gpulayer.worker.process import RunAs

    python = "/usr/bin/python3"
    base = Path(tempfile.mkdtemp(prefix="gpulayer-fds-"))
    base.chmod(0o755)
    containment = Containment.for_worker(base / "work")
    assert containment.mode == "cgroup"
    victim = subprocess.Popen(["sleep", "300"])  # a root process outside every attempt
    before = Path(f"/proc/{victim.pid}/cgroup").read_text()
    lines: list[str] = []
    try:
        job = JobSpec.model_validate(
            {
                "workload": {
                    "kind": "command",
                    "command": [python, "-c", _MOVE_ROOT_PROCESS, str(victim.pid)],
                }
            }
        )
        group = containment.attempt(3)
        context = RunContext(
            "job-fds", 1, job, base / "attempt", group=group, run_as=RunAs.lookup("nobody")
        )
        outcome = JobRun(context, on_log=lambda stream, text: lines.append(text)).run()
        group.close()
        assert outcome.state == "succeeded", (outcome, lines)
        (report,) = [json.loads(t[4:]) for t in lines if t.startswith("FDS ")]
        assert report["moved"] == []
        assert [t for t in report["held"] if not t.startswith("/proc/")] == []
        assert Path(f"/proc/{victim.pid}/cgroup").read_text() == before
    finally:
        victim.kill()
        victim.wait(10)
        containment.sweep()
        if containment.root is not None:
            containment.root.rmdir()
        shutil.rmtree(base, ignore_errors=True)
