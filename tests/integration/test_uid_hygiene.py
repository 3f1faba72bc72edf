"""Before a uid of a --run-as-range goes to its next attempt nothing its last one made is left
(SysV IPC, POSIX message queues, files in any world-writable folder), a range is one worker's
on the machine, and a worker whose interpreter its range's users cannot run does not start.
Real server and worker processes, run as root."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import run_cli
from tests.support.cluster import command_job, submit
from tests.support.procs import processes_with, wait_until
from tests.support.servers import WorkerProcess, wait_for_job, wait_for_workers

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="running jobs as other uids needs root"),
]

PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "python3"


@pytest.fixture
def open_work_dir() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="gpulayer-hygiene-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


# Leaves, for whoever gets its uid next: a 64 MiB SysV shared-memory segment, a semaphore set
# and a message queue (each under a known key), a POSIX message queue, a key in its user keyring,
# and a file in /run/lock (and in a world-writable folder of the test's making), each holding
# its secret.
_LEAVE = r"""
import ctypes, os, platform, sys
libc = ctypes.CDLL(None, use_errno=True)
KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}[platform.machine()]
libc.shmat.restype = ctypes.c_void_p
key, marker, extra = int(sys.argv[1]), sys.argv[2], sys.argv[3]
secret = os.environ["HF_TOKEN"].encode()
shm = libc.shmget(key, 64 << 20, 0o1000 | 0o600)
assert shm >= 0, ctypes.get_errno()
addr = libc.shmat(shm, None, 0)
ctypes.memmove(addr, secret, len(secret))
assert libc.semget(key, 1, 0o1000 | 0o600) >= 0
msq = libc.msgget(key, 0o1000 | 0o600)
assert msq >= 0
mq = libc.mq_open(("/" + marker).encode(), os.O_CREAT | os.O_RDWR, 0o600, None)
assert mq >= 0, ctypes.get_errno()
assert libc.syscall(KEYCTL[0], b"user", marker.encode(), secret, len(secret), -4) > 0
for folder in ("/run/lock", extra):
    with open(os.path.join(folder, marker), "wb") as f:
        f.write(secret)
print("UID", os.getuid(), flush=True)
"""

# Looks for all of it.
_LOOK = r"""
import ctypes, json, os, platform, sys
libc = ctypes.CDLL(None, use_errno=True)
KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}[platform.machine()]
libc.shmat.restype = ctypes.c_void_p
key, marker, extra = int(sys.argv[1]), sys.argv[2], sys.argv[3]
found = {"uid": os.getuid()}
shm = libc.shmget(key, 0, 0)
if shm >= 0:
    addr = libc.shmat(shm, None, 0o10000)
    found["shm"] = ctypes.string_at(addr, 40).rstrip(b"\0").decode(errors="replace")
found["sem"] = libc.semget(key, 0, 0) >= 0
found["msg"] = libc.msgget(key, 0) >= 0
found["mq"] = libc.mq_open(("/" + marker).encode(), os.O_RDONLY) >= 0
key = libc.syscall(KEYCTL[1], 10, -4, b"user", marker.encode(), 0)  # KEYCTL_SEARCH in @u
if key > 0:
    data = ctypes.create_string_buffer(64)
    size = libc.syscall(KEYCTL[1], 11, key, data, 64)  # KEYCTL_READ
    found["key"] = data.raw[: max(size, 0)].decode(errors="replace")
for folder in ("/run/lock", extra):
    try:
        with open(os.path.join(folder, marker)) as f:
            found[folder] = f.read()
    except OSError as exc:
        found[folder] = exc.strerror
print("SPY " + json.dumps(found), flush=True)
"""


def printed(client: Any, job_id: str, prefix: str) -> str:
    (line,) = [x["text"] for x in client.logs(job_id)["lines"] if x["text"].startswith(prefix)]
    return str(line).removeprefix(prefix).strip()


def ipc_owned_by(uid: int) -> list[str]:
    """SysV IPC objects of this machine's (the test's) namespace that uid owns."""
    found = []
    for kind in ("shm", "sem", "msg"):
        lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()
        header = lines[0].split()
        for line in lines[1:]:
            fields = dict(zip(header, line.split(), strict=False))
            if int(fields["uid"]) == uid:
                found.append(f"{kind} {fields['key']}")
    return found


@contextlib.contextmanager
def world_writable_folder() -> Iterator[Path]:
    """A sticky world-writable folder outside the usual temp folders, as /run/lock is."""
    folder = Path(tempfile.mkdtemp(prefix="gpulayer-shared-", dir="/var/cache"))
    folder.chmod(0o1777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_ipc_and_world_writable_files_of_an_attempt_are_gone_before_its_uid_is_reused(
    cluster_factory: Any, open_work_dir: Path
) -> None:
    cluster = cluster_factory(0)
    client = cluster.client
    marker = f"gl-ipc-{secrets.token_hex(4)}"
    key = 0x5A000000 + secrets.randbelow(0xFFFFFF)
    token_value = f"hf_{secrets.token_hex(12)}"
    with world_writable_folder() as extra:
        cluster.add_worker(
            "hygienic", None, "--run-as-range", "61060-61069", "--work-dir", str(open_work_dir)
        )
        wait_for_workers(client, 1)
        try:
            first_spec = command_job([PYTHON, "-c", _LEAVE, str(key), marker, str(extra)])
            first_spec["env"] = {"HF_TOKEN": token_value}
            first = submit(client, first_spec)
            done = wait_for_job(client, first, {"succeeded", "failed"})
            assert done["state"] == "succeeded", (done["message"], client.logs(first)["lines"])
            uid = int(printed(client, first, "UID "))
            second = submit(
                client, command_job([PYTHON, "-c", _LOOK, str(key), marker, str(extra)])
            )
            done = wait_for_job(client, second, {"succeeded", "failed"})
            assert done["state"] == "succeeded", (done["message"], client.logs(second)["lines"])
            report = json.loads(printed(client, second, "SPY "))
            assert report["uid"] == uid, report  # the same uid again
            assert "shm" not in report and "key" not in report, report
            assert token_value not in json.dumps(report), report
            assert (report["sem"], report["msg"], report["mq"]) == (False, False, False), report
            assert report["/run/lock"] == "No such file or directory", report
            assert report[str(extra)] == "No such file or directory", report
            assert ipc_owned_by(uid) == []
            assert not Path("/run/lock", marker).exists()
        finally:
            Path("/run/lock", marker).unlink(missing_ok=True)
            for kind in ("-m", "-s", "-q"):
                subprocess.run(["ipcrm", kind.upper(), str(key)], capture_output=True, check=False)


def test_two_workers_cannot_share_a_uid_of_a_range(
    cluster_factory: Any, tmp_path: Path, open_work_dir: Path
) -> None:
    cluster = cluster_factory(0)
    client = cluster.client
    first = cluster.add_worker(
        "holder", None, "--run-as-range", "61080-61089", "--work-dir", str(open_work_dir)
    )
    wait_for_workers(client, 1)
    marker = f"gl-range-{secrets.token_hex(4)}"
    job = submit(client, command_job([PYTHON, "-c", "import time; time.sleep(600)", marker]))
    wait_until(lambda: processes_with(marker), 30, "the first worker's job is up")
    other = open_work_dir / "other-work"  # one its uids could reach: only the lock refuses
    other.mkdir()
    other.chmod(0o755)
    second = WorkerProcess(cluster.server.url, cluster.worker_token, tmp_path / "b", "intruder")
    # Overlapping, not equal: uid 61089 is in both.
    second.start(0.5, "--run-as-range", "61089-61099", "--work-dir", str(other))
    assert second.process is not None
    code = second.process.wait(60)
    second.stop()
    log = (second.home / "worker.log").read_text()
    assert code == 2, log
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--run-as-range" in errors[0] and "61089" in errors[0], log
    assert "Traceback" not in log
    # The first worker's job was not touched.
    assert processes_with(marker) and client.job(job)["state"] == "running"
    assert first.process is not None and first.process.poll() is None
    client.cancel(job)
    wait_for_job(client, job, {"cancelled"})


def test_a_worker_whose_range_cannot_run_its_interpreter_refuses_to_start(
    tmp_path: Path, open_work_dir: Path
) -> None:
    # This test's own interpreter lies under a home closed to other users (/root, 0700).
    closed = [p for p in Path(sys.executable).parents if p.stat().st_mode & 0o001 == 0]
    if not closed:
        pytest.skip("this machine's interpreter is reachable by every user")
    token_file = tmp_path / "join.token"
    token_file.write_text("gl_x\n")
    base = ["worker", "start", "--server", "http://127.0.0.1:9", "--token-file", str(token_file)]
    result = run_cli(
        [*base, "--run-as-range", "61110-61119", "--work-dir", str(open_work_dir)],
        env={"GPULAYER_HOME": str(tmp_path / "home")},
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --run-as-range:"), result.stderr
    assert sys.executable in lines[0] and "cannot" in lines[0], lines[0]
