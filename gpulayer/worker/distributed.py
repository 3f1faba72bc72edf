"""Launch line for a distributed workload on one node: torch.distributed.run (torchrun).

torchrun is started as ``<python> -m torch.distributed.run`` so its ranks use the same
interpreter as the rest of the job, whatever ``torchrun`` is first on PATH.
"""

from __future__ import annotations

import math
from pathlib import Path

from gpulayer.errors import GpulayerError
from gpulayer.spec.models import DistributedWorkload


class MultiNodeNotSupportedError(GpulayerError):
    """A distributed workload with more than one worker needs a multi-node launcher."""


def launch_argv(workload: DistributedWorkload, *, python: str, function_shim: Path) -> list[str]:
    """The argv that runs ``workload`` with torchrun on this node. A function workload runs
    ``function_shim`` in every rank."""
    if workload.num_workers != 1:
        raise MultiNodeNotSupportedError(
            f"workload.num_workers: {workload.num_workers} workers need a multi-node launcher; "
            "this worker runs distributed jobs on one node only (num_workers 1)"
        )
    argv = [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc-per-node={workload.procs_per_worker}",
        # One node needs no agreed port: a free local one avoids clashes between jobs
        # sharing this machine. rendezvous.port is for jobs that span nodes.
        "--standalone",
        f"--rdzv-conf=join_timeout={math.ceil(workload.rendezvous.join_timeout_seconds)}",
        # Distributed jobs are never retried, not even rank by rank.
        "--max-restarts=0",
    ]
    if workload.function is not None:
        return [*argv, str(function_shim)]
    assert workload.entrypoint is not None  # the spec requires one of the two
    return [*argv, workload.entrypoint, *workload.args]


def launch_env(workload: DistributedWorkload) -> dict[str, str]:
    env: dict[str, str] = {"GPULAYER_COMM_BACKEND": workload.comm_backend or "gloo"}
    if workload.function is not None:
        env["GPULAYER_FUNCTION_RANKED"] = "1"
    return env
