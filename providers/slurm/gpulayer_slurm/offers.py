"""A cluster's offers: one per partition and node shape. Pure.

An offer's region is the partition in its cluster (``lab/gpu``, see :mod:`gpulayer_slurm.regions`),
its zone the partition and its instance type the node shape (``4cpu-16gb-2xa100``), so its label
reads ``slurm/gpu/4cpu-16gb-2xa100``; it carries the partition's time limit and how many nodes
of the shape are idle when it was read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpulayer.cloud import Offer, gpu_facts, normalize_cpu_arch
from gpulayer_slurm.errors import PROVIDER
from gpulayer_slurm.parsing import NodeInfo, PartitionInfo
from gpulayer_slurm.regions import region
from gpulayer_slurm.settings import SlurmCluster


@dataclass(frozen=True)
class Shape:
    """Nodes alike for a job: the same cores, memory and GPUs."""

    cpus: int
    memory_mb: int
    gpu_type: str | None
    gpu_count: int
    typed: bool = False
    """Slurm's GRES names the GPU type (``gpu:a100:2``), so sbatch may ask for it by name."""
    shared: bool = False
    """Part of a node (some of its GPUs, cores and memory in proportion), beside other jobs."""

    @property
    def name(self) -> str:
        """``4cpu-16gb``, ``4cpu-16gb-2xa100`` or ``2cpu-8gb-1xa100-shared``: part of the
        offer's instance type."""
        gb = self.memory_mb / 1024
        memory = f"{gb:.0f}" if gb >= 10 else f"{gb:.1f}".rstrip("0").rstrip(".")
        text = f"{self.cpus}cpu-{memory}gb"
        if self.gpu_count:
            text += f"-{self.gpu_count}x{self.gpu_type or 'gpu'}"
        return text + ("-shared" if self.shared else "")

    def share(self, gpus: int) -> Shape:
        """``gpus`` of this node's GPUs with its cores and memory in proportion."""
        return replace(
            self,
            cpus=max(1, self.cpus * gpus // self.gpu_count),
            memory_mb=self.memory_mb * gpus // self.gpu_count,
            gpu_count=gpus,
            shared=True,
        )


@dataclass(frozen=True)
class PartitionShape:
    """One offer with the nodes it stands for."""

    cluster: str
    partition: str
    shape: Shape
    nodes: tuple[str, ...]
    offer: Offer

    @property
    def instance_type(self) -> str:
        return self.offer.instance_type

    @property
    def idle_nodes(self) -> int:
        return self.offer.idle_nodes or 0

    @property
    def max_time_seconds(self) -> int | None:
        return self.offer.time_limit_seconds


def offered_partitions(cluster: SlurmCluster, partitions: Sequence[PartitionInfo]) -> list[str]:
    """The partitions of the cluster gpulayer may submit to (up or not)."""
    wanted = set(cluster.partitions) if cluster.partitions else None
    return [p.name for p in partitions if wanted is None or p.name in wanted]


def partition_shapes(
    cluster_name: str,
    cluster: SlurmCluster,
    partitions: Sequence[PartitionInfo],
    nodes: Sequence[NodeInfo],
) -> list[PartitionShape]:
    """Every (partition, shape) of the cluster's wanted partitions that are up and have a node
    that can run jobs; idle nodes counted now."""
    wanted = set(cluster.partitions) if cluster.partitions else None
    found = []
    for part in partitions:
        if not part.up or (wanted is not None and part.name not in wanted):
            continue
        by_shape: dict[Shape, list[NodeInfo]] = {}
        for node in nodes:
            if part.name not in node.partitions or not node.usable:
                continue
            gpu_type, gpu_count = node.gpus()
            typed = gpu_type is not None
            if gpu_count and gpu_type is None:
                gpu_type = cluster.gpu_types.get(part.name)
            shape = Shape(node.cpus, node.memory_mb, gpu_type, gpu_count, typed)
            by_shape.setdefault(shape, []).append(node)
        for shape, members in sorted(by_shape.items(), key=lambda item: item[0].name):
            found += [
                PartitionShape(
                    cluster=cluster_name,
                    partition=part.name,
                    shape=offered,
                    nodes=tuple(n.name for n in members),
                    offer=_offer(cluster_name, cluster, part, offered, shape, members),
                )
                for offered in (shape, *_shares(part, shape))
            ]
    return found


def _shares(partition: PartitionInfo, shape: Shape) -> list[Shape]:
    """Parts of a node of ``shape`` that a job may ask for alone: 1 to all-but-one of its
    GPUs, where the partition lets jobs share nodes."""
    if partition.exclusive or shape.gpu_count < 2:
        return []
    return [shape.share(gpus) for gpus in range(1, shape.gpu_count)]


def _offer(
    cluster_name: str,
    cluster: SlurmCluster,
    partition: PartitionInfo,
    shape: Shape,
    node: Shape,
    members: Sequence[NodeInfo],
) -> Offer:
    """The offer of ``shape``, on nodes of shape ``node`` (itself, or the node it shares)."""
    facts = gpu_facts(shape.gpu_type) if shape.gpu_type else None
    # A share of a node is priced as that part of the node-hour.
    fraction = shape.gpu_count / node.gpu_count if shape.shared else 1.0
    arch = next((n.cpu_arch for n in members if n.cpu_arch), None)
    return Offer(
        provider=PROVIDER,
        instance_type=shape.name,
        region=region(cluster_name, partition.name),
        zone=partition.name,
        accelerator="cuda" if shape.gpu_count else "cpu",
        gpu_name=facts.name if facts is not None else shape.gpu_type,
        gpu_count=shape.gpu_count,
        gpu_memory_gb=facts.memory_gb if facts is not None else None,
        gpu_memory_kind=facts.memory_kind if facts is not None else None,
        cuda_compute_capability=facts.compute_capability if facts is not None else None,
        cpu_cores=shape.cpus,
        memory_gb=round(shape.memory_mb / 1024, 3),
        cpu_arch=normalize_cpu_arch(arch) if arch else "x86_64",
        hourly_price=cluster.price(partition.name) * fraction,
        currency=cluster.currency,
        idle_nodes=sum(1 for n in members if _free(n, shared=shape.shared)),
        time_limit_seconds=partition.max_time_seconds,
    )


def _free(node: NodeInfo, *, shared: bool) -> bool:
    """Could take the offer now: idle, or for a share also a node other jobs use in part."""
    return node.idle or (shared and node.usable and "MIXED" in node.state_words)
