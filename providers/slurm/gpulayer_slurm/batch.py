"""The ``sbatch`` command line of one allocation, and the tags it carries. Pure.

The allocation holds its nodes with one step per node (``srun``) until its batch script is
told to end (:data:`END_SIGNAL`: it returns, and the allocation ends COMPLETED), it is
cancelled, or its time limit ends it. That step is the launcher of gpulayer's worker on its
node: the bootstrap over SSH installs the worker and hands its start to the step, so the
worker runs inside the allocation (Slurm's accounting, limits and signals reach it, and a
preemption or ``scancel`` ends it with the allocation). Its job name carries the job's name and
the launch request, and its comment gpulayer's tags, so ``squeue`` finds it again after a
controller restart."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpulayer.cloud import LAUNCH_DIR_VARIABLE, launcher_loop

_TAG_WORD = re.compile(r"^[A-Za-z0-9_.:@+-]+$")
_ROOT_VARIABLE = "GPULAYER_STEP_ROOT"
_JOB_VARIABLE = "GPULAYER_STEP_JOB"
END_SIGNAL = "USR1"
"""What tells the batch script that its job ended by itself (``scancel --batch --signal``,
which signals the script alone and cancels nothing)."""


def node_launcher(install_root: str, job_id: str) -> str:
    """The batch script: one step per node whose task launches the worker handed to the
    node's install dir, ``install_root/job_id`` on node 0 and ``install_root/job_id-nodeN``
    on node N (SLURM_NODEID), as :func:`gpulayer.cloud.node_install_dir` places them. The
    dir travels in the environment, not in the task's arguments (see ``launcher_loop``)."""
    return (
        f"export {_ROOT_VARIABLE}={shlex.quote(install_root)} "
        f"{_JOB_VARIABLE}={shlex.quote(job_id)}; {_steps()}"
    )


def array_launcher(install_root: str, jobs: Mapping[int, str]) -> str:
    """The batch script of a job array: each task is one job's allocation, whose worker it
    launches from ``install_root/JOB``, JOB being the job of its ``SLURM_ARRAY_TASK_ID``
    (``jobs``: task -> gpulayer job id); a task with no job of its own ends at once."""
    cases = " ".join(f"{task}) {_JOB_VARIABLE}={shlex.quote(job)};;" for task, job in jobs.items())
    return (
        f"export {_ROOT_VARIABLE}={shlex.quote(install_root)}; "
        f'case "$SLURM_ARRAY_TASK_ID" in {cases} *) exit 1;; esac; '
        f"export {_JOB_VARIABLE}; {_steps()}"
    )


def _steps() -> str:
    d = LAUNCH_DIR_VARIABLE
    task = (
        f'{d}="${_ROOT_VARIABLE}/${_JOB_VARIABLE}"; '
        f'[ "${{SLURM_NODEID:-0}}" = 0 ] || {d}="${d}-node$SLURM_NODEID"; '
        f"export {d}; {launcher_loop()}"
    )
    # The step runs in the background so that the shell can take END_SIGNAL while it waits,
    # and return 0: the allocation then ends COMPLETED (Slurm ends the step with it).
    return (
        f"trap 'exit 0' {END_SIGNAL}; srun --ntasks-per-node=1 sh -c {shlex.quote(task)} & wait $!"
    )


def end_command(slurm_job_ids: Sequence[str]) -> str:
    """Tell the batch scripts of ``slurm_job_ids`` to return (see :func:`node_launcher`)."""
    return shlex.join(["scancel", "--batch", f"--signal={END_SIGNAL}", *slurm_job_ids])


@dataclass(frozen=True)
class Share:
    """Part of each node an allocation asks for, beside other jobs on it."""

    cpus: int
    memory_mb: int
    gpu_type: str | None
    """As Slurm's GRES names it; None: any GPU of the node (the excluded nodes keep others
    out)."""


SQUEUE_FORMAT = "%i|%j|%T|%r|%N|%L|%k"


def comment(tags: Mapping[str, str]) -> str:
    """``k=v,k=v`` of the tags that are plain words (gpulayer's own ids always are)."""
    return ",".join(
        f"{k}={v}" for k, v in sorted(tags.items()) if _TAG_WORD.match(k) and _TAG_WORD.match(v)
    )


def parse_comment(text: str) -> dict[str, str]:
    found = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep and key:
            found[key] = value
    return found


def sbatch_command(
    *,
    job_name: str,
    tags: Mapping[str, str],
    partition: str,
    nodes: int,
    gpus_per_node: int,
    account: str | None,
    qos: str | None,
    time_limit: str | None,
    install_root: str,
    job_id: str,
    exclude: Sequence[str] = (),
    share: Share | None = None,
    array: tuple[str, Mapping[int, str]] | None = None,
) -> str:
    """``sbatch --parsable ...``: whole nodes (the offer is a node shape, priced per
    node-hour), or with ``share`` part of each node beside other jobs, one task each,
    launching the job's worker on each node (``node_launcher``); ``exclude`` keeps the
    partition's nodes of other shapes out. ``array``: (``--array`` value, task -> job id):
    one job array whose every task is an allocation of its own, for its own job."""
    args = [
        "sbatch", "--parsable", f"--job-name={job_name}", f"--comment={comment(tags)}",
        f"--partition={partition}", f"--nodes={nodes}", "--ntasks-per-node=1",
        "--output=/dev/null", "--chdir=/tmp",
        # Never requeued: a preempted allocation ends PREEMPTED and a failed node NODE_FAIL,
        # so gpulayer tells the two apart (and retries the job itself).
        "--no-requeue",
    ]  # fmt: skip
    if share is None:
        args += ["--exclusive", "--mem=0"]
    else:
        args += [f"--cpus-per-task={share.cpus}", f"--mem={share.memory_mb}M"]
    if gpus_per_node:
        typed = f"{share.gpu_type}:" if share is not None and share.gpu_type else ""
        args.append(f"--gres=gpu:{typed}{gpus_per_node}")
    if account:
        args.append(f"--account={account}")
    if qos:
        args.append(f"--qos={qos}")
    if time_limit:
        args.append(f"--time={time_limit}")
    if exclude:
        args.append(f"--exclude={','.join(exclude)}")
    if array is not None:
        args.append(f"--array={array[0]}")
        args.append(f"--wrap={array_launcher(install_root, array[1])}")
    else:
        args.append(f"--wrap={node_launcher(install_root, job_id)}")
    return shlex.join(args)


def squeue_command(
    *, name: str | None = None, user_only: bool = True, ended_too: bool = False
) -> str:
    """Every job of the login user (or of one job name) as :func:`parsing.parse_squeue` reads.
    ``ended_too``: jobs that ended within the cluster's MinJobAge as well, with the state they
    ended in (PREEMPTED, NODE_FAIL, TIMEOUT...), which squeue leaves out by default."""
    # -r: a job array's every task on a line of its own (JOBID_TASK), pending ones too.
    args = ["squeue", "-h", "-r", "-o", SQUEUE_FORMAT]
    if ended_too:
        args.append("--states=all")
    if user_only:
        args.append("--me")
    if name:
        args.append(f"--name={name}")
    return shlex.join(args)


def node_addresses_command(names: Sequence[str]) -> str:
    return shlex.join(["scontrol", "-o", "show", "node", ",".join(names)])
