"""A job's first process under a cgroup per attempt: held by a shell until the worker has moved
it into the attempt's cgroup, so the job's own first instruction already runs there; a program
that does not exist cannot start (as without the hold, not an exit 127); a process that cannot
join never runs the job; and the job holds nothing of the worker's, stdin on /dev/null.

Real processes in a real cgroup v2 (skipped where this machine gives none)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer.worker.containment import AttemptGroup, Containment
from gpulayer.worker.process import ProcessTree
from tests.integration.test_containment import cgroup_usable

pytestmark = pytest.mark.skipif(not cgroup_usable(), reason="no writable cgroup v2 here")


@pytest.fixture()
def group(tmp_path: Path) -> Iterator[AttemptGroup]:
    containment = Containment.for_worker(tmp_path / "work")
    assert containment.mode == "cgroup"
    made = containment.attempt(7)
    yield made
    containment.sweep()
    made.close()
    assert containment.root is not None
    containment.root.rmdir()


def run(argv: list[str], cwd: Path, group: AttemptGroup) -> tuple[int, str, str]:
    tree = ProcessTree.spawn(argv, cwd=cwd, env=dict(os.environ), group=group)
    assert tree.popen.stdout is not None and tree.popen.stderr is not None
    out = tree.popen.stdout.read().decode()
    err = tree.popen.stderr.read().decode()
    return tree.close(), out, err


def test_the_jobs_first_instruction_runs_in_its_attempts_cgroup(
    group: AttemptGroup, tmp_path: Path
) -> None:
    code, out, err = run(["cat", "/proc/self/cgroup"], tmp_path, group)
    assert code == 0, err
    assert group.directory is not None
    assert out.strip().endswith(f"/{group.directory.name}"), out


_FDS = """
import json, os
found = {}
for fd in os.listdir("/proc/self/fd"):
    try:
        found[fd] = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        pass  # the descriptor listdir read the folder through, closed since
print(json.dumps(found))
"""


def test_the_job_holds_only_its_own_streams_with_stdin_on_dev_null(
    group: AttemptGroup, tmp_path: Path
) -> None:
    code, out, err = run([sys.executable, "-c", _FDS], tmp_path, group)
    assert code == 0, err
    fds = json.loads(out)
    assert fds["0"] == "/dev/null"
    assert fds["1"].startswith("pipe:") and fds["2"].startswith("pipe:")
    assert sorted(fds) == ["0", "1", "2"], fds


@pytest.mark.parametrize("program", ["gpulayer-no-such-program", "./missing.sh"])
def test_a_program_that_does_not_exist_cannot_start(
    group: AttemptGroup, tmp_path: Path, program: str
) -> None:
    with pytest.raises(FileNotFoundError):
        ProcessTree.spawn([program], cwd=tmp_path, env=dict(os.environ), group=group)
    assert group.pids() == set()


def test_a_process_that_cannot_join_its_cgroup_never_runs_the_job(
    group: AttemptGroup, tmp_path: Path
) -> None:
    assert group.directory is not None
    group.directory.rmdir()  # gone: the worker cannot move the process into it
    marker = tmp_path / "ran"
    with pytest.raises(OSError, match="could not join its attempt"):
        ProcessTree.spawn(["touch", str(marker)], cwd=tmp_path, env=dict(os.environ), group=group)
    assert not marker.exists()
    group.directory.mkdir()  # for the fixture's clean-up
