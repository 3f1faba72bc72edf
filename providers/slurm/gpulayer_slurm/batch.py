"""The ``sbatch`` command line of one allocation, and the tags it carries. Pure.

The allocation holds its nodes with one step per node (``srun``) until it is cancelled or
its time limit ends it; gpulayer's worker runs on each node inside it. Its job name names the
launch request and its comment carries gpulayer's tags, so ``squeue`` finds it again after a
controller restart."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence

_TAG_WORD = re.compile(r"^[A-Za-z0-9_.:@+-]+$")
HOLD_STEP = "exec srun --ntasks-per-node=1 sleep infinity"
SQUEUE_FORMAT = "%i|%j|%T|%r|%N|%k"


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
    exclude: Sequence[str] = (),
) -> str:
    """``sbatch --parsable ...``: whole nodes (the offer is a node shape, priced per
    node-hour), one task each; ``exclude`` keeps the partition's nodes of other shapes out."""
    args = [
        "sbatch", "--parsable", f"--job-name={job_name}", f"--comment={comment(tags)}",
        f"--partition={partition}", f"--nodes={nodes}", "--ntasks-per-node=1", "--exclusive",
        "--mem=0", "--output=/dev/null", "--chdir=/tmp",
        # Never requeued: a preempted allocation ends PREEMPTED and a failed node NODE_FAIL,
        # so gpulayer tells the two apart (and retries the job itself).
        "--no-requeue",
    ]  # fmt: skip
    if gpus_per_node:
        args.append(f"--gres=gpu:{gpus_per_node}")
    if account:
        args.append(f"--account={account}")
    if qos:
        args.append(f"--qos={qos}")
    if time_limit:
        args.append(f"--time={time_limit}")
    if exclude:
        args.append(f"--exclude={','.join(exclude)}")
    args.append(f"--wrap={HOLD_STEP}")
    return shlex.join(args)


def squeue_command(
    *, name: str | None = None, user_only: bool = True, ended_too: bool = False
) -> str:
    """Every job of the login user (or of one job name) as :func:`parsing.parse_squeue` reads.
    ``ended_too``: jobs that ended within the cluster's MinJobAge as well, with the state they
    ended in (PREEMPTED, NODE_FAIL, TIMEOUT...), which squeue leaves out by default."""
    args = ["squeue", "-h", "-o", SQUEUE_FORMAT]
    if ended_too:
        args.append("--states=all")
    if user_only:
        args.append("--me")
    if name:
        args.append(f"--name={name}")
    return shlex.join(args)


def node_addresses_command(names: Sequence[str]) -> str:
    return shlex.join(["scontrol", "-o", "show", "node", ",".join(names)])
