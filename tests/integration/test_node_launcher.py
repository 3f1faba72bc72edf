"""The Slurm allocation's batch script as the nodes run it: a stand-in ``srun`` on PATH runs
the step's task once per node (SLURM_NODEID 0 and 1), as Slurm does, and each task starts what
a bootstrap hands to its node's install dir, again and again."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from gpulayer_slurm.batch import node_launcher

from gpulayer.cloud import node_install_dir
from tests.support.procs import wait_until


def _hand_off(install_dir: Path, marker: Path) -> None:
    """What bootstrap.sh --hand-off leaves: DIR/launch, a script the launcher runs."""
    install_dir.mkdir(parents=True, exist_ok=True)
    ready = install_dir / "launch.tmp"
    ready.write_text(f'echo "$$ $SLURM_NODEID $(pwd)" >> {marker}\n')
    ready.rename(install_dir / "launch")


def test_each_node_launches_what_is_handed_to_its_own_install_dir(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    # Two nodes: the task runs once with each SLURM_NODEID, in /tmp as sbatch --chdir=/tmp.
    srun.write_text(
        "#!/bin/sh\n"
        'while [ "$1" != sh ]; do shift; done\n'
        'cd /tmp && { SLURM_NODEID=0 "$@" & SLURM_NODEID=1 "$@" & wait; }\n'
    )
    srun.chmod(0o755)
    root = tmp_path / "root"
    script = node_launcher(str(root), "j-1")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    batch = subprocess.Popen(["sh", "-c", script], env=env, start_new_session=True)
    try:
        markers = [tmp_path / "node0.txt", tmp_path / "node1.txt"]
        dirs = [Path(node_install_dir(str(root), "j-1", rank)) for rank in (0, 1)]
        assert [d.name for d in dirs] == ["j-1", "j-1-node1"]
        for directory, marker in zip(dirs, markers, strict=True):
            _hand_off(directory, marker)
        wait_until(lambda: all(m.exists() for m in markers), timeout=20, what="both launches")
        for rank, marker in enumerate(markers):
            pid, node, _ = marker.read_text().split()
            assert node == str(rank) and pid.isdigit()
            assert not (dirs[rank] / "launch").exists() and (dirs[rank] / "launch.run").exists()
        # A bootstrap after the first worker ended (a controller that restarted) is run too.
        _hand_off(dirs[0], markers[0])
        wait_until(
            lambda: len(markers[0].read_text().splitlines()) == 2, timeout=20, what="a relaunch"
        )
        # No task of the step names an install dir in its arguments: a stop of the worker,
        # which ends whatever does, leaves the launcher to take the next one.
        listed = subprocess.run(
            ["ps", "-o", "args=", "--sid", str(batch.pid)], capture_output=True, text=True
        ).stdout
        tasks = [line for line in listed.splitlines() if line.startswith("sh -c")]
        assert tasks and not any(str(root) in task for task in tasks), listed
        assert batch.poll() is None
    finally:
        os.killpg(batch.pid, signal.SIGKILL)
        batch.wait(timeout=10)
