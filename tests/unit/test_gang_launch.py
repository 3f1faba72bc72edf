"""The torchrun line and environment of one node of a gang: pure."""

from __future__ import annotations

from pathlib import Path

from gpulayer.spec import JobSpec
from gpulayer.spec.models import DistributedWorkload
from gpulayer.worker.distributed import NodePlace, launch_argv, launch_env


def workload(**fields: object) -> DistributedWorkload:
    spec = JobSpec.model_validate(
        {
            "workload": {
                "kind": "distributed",
                "entrypoint": "train.py",
                "num_workers": 2,
                "procs_per_worker": 3,
                "rendezvous": {"port": 29611, "join_timeout_seconds": 42.5},
                **fields,
            }
        }
    )
    assert isinstance(spec.workload, DistributedWorkload)
    return spec.workload


def test_each_node_joins_a_static_rendezvous_at_node_zero_with_its_own_rank() -> None:
    leader = NodePlace(0, 2, "10.9.0.2", "10.9.0.2")
    follower = NodePlace(1, 2, "10.9.0.2", "10.9.0.3")
    argvs = [
        launch_argv(workload(), python="py", function_shim=Path("shim.py"), job_id="j-1", node=n)
        for n in (leader, follower)
    ]
    for rank, argv in enumerate(argvs):
        assert argv[:3] == ["py", "-m", "torch.distributed.run"]
        # A static rendezvous keeps --node-rank; c10d would renumber nodes as they arrive.
        assert "--nnodes=2" in argv and f"--node-rank={rank}" in argv
        assert "--nproc-per-node=3" in argv and "--rdzv-backend=static" in argv
        assert "--master-addr=10.9.0.2" in argv and "--master-port=29611" in argv
        assert "--rdzv-id=j-1" in argv and not any(a.startswith("--rdzv-endpoint") for a in argv)
        # join_timeout_seconds, rounded up, is how long the nodes may take to meet.
        assert "--rdzv-conf=timeout=43" in argv
        assert "--standalone" not in argv and argv[-1] == "train.py"
    assert "--local-addr=10.9.0.3" in argvs[1]


def test_a_node_knows_its_rank_and_uses_the_interface_of_its_address() -> None:
    env = launch_env(workload(), NodePlace(1, 2, "127.0.0.1", "127.0.0.1"))
    assert env["GPULAYER_NODE_RANK"] == "1" and env["GPULAYER_NUM_NODES"] == "2"
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "lo"
    alone = launch_env(workload(num_workers=1))
    assert alone["GPULAYER_NUM_NODES"] == "1" and "GLOO_SOCKET_IFNAME" not in alone
