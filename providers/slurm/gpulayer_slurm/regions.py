"""A partition as a region: ``CLUSTER/PARTITION``, inside the region ``CLUSTER``. Pure.

A job names where it may run with ``placement.regions``: the cluster's name takes every
partition of it, ``CLUSTER/PARTITION`` one of them. Regions no cluster of this provider has are
another provider's (``us-east-1``) and ask for nothing here; a partition's name without its
cluster is the commonest slip, and is answered with what to write instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

SEPARATOR = "/"


def region(cluster: str, partition: str) -> str:
    return f"{cluster}{SEPARATOR}{partition}"


def cluster_of(name: str) -> str:
    """The cluster of a region (``lab/gpu`` -> ``lab``; an offer of an older release named the
    cluster alone)."""
    return name.split(SEPARATOR, 1)[0]


@dataclass(frozen=True)
class Wanted:
    """What a query's regions ask of this provider's clusters."""

    partitions: dict[str, frozenset[str] | None]
    """Cluster -> the partitions asked for (None: every one)."""
    bare: tuple[str, ...]
    """Regions without a ``/`` that name no cluster: perhaps a partition named alone."""

    def keeps(self, cluster: str, partition: str) -> bool:
        wanted = self.partitions.get(cluster, frozenset())
        return wanted is None or partition in wanted


def wanted(regions: Sequence[str], clusters: Iterable[str]) -> Wanted:
    """Which clusters and partitions ``regions`` ask for (all of them when it is empty)."""
    names = list(clusters)
    if not regions:
        return Wanted({name: None for name in names}, ())
    partitions: dict[str, frozenset[str] | None] = {}
    bare = []
    for item in regions:
        cluster, sep, partition = item.partition(SEPARATOR)
        if cluster not in names:
            if not sep:
                bare.append(item)
            continue
        if not sep:
            partitions[cluster] = None
        elif partitions.get(cluster, frozenset()) is not None:
            partitions[cluster] = frozenset({*(partitions.get(cluster) or ()), partition})
    return Wanted(partitions, tuple(bare))


def misnamed(want: Wanted, partitions_of: Mapping[str, Sequence[str]]) -> str | None:
    """One line on a region that names a partition wrongly (alone, or one its cluster does not
    have), given each asked cluster's partitions; None when every region is right."""
    for name in want.bare:
        homes = sorted(c for c, parts in partitions_of.items() if name in parts)
        if homes:
            written = " or ".join(region(c, name) for c in homes)
            return (
                f"placement.regions: {name!r} is a partition of cluster {homes[0]}: "
                f"name it {written}"
            )
    for cluster, asked in want.partitions.items():
        known = partitions_of.get(cluster)
        if asked is None or known is None:
            continue
        for partition in sorted(asked - set(known)):
            return (
                f"placement.regions: cluster {cluster} has no partition {partition!r} "
                f"(partitions: {', '.join(sorted(known))})"
            )
    return None
