"""A Slurm partition as a region: CLUSTER takes all its partitions, CLUSTER/PARTITION one;
a partition named wrongly is one line saying what to write. Pure."""

from __future__ import annotations

from gpulayer_slurm import regions

from gpulayer.cloud.ranking import BlockList, outer_region

CLUSTERS = ("lab", "hpc")
PARTITIONS = {"lab": ["cpu", "gpu"], "hpc": ["gpu", "big"]}


def test_no_regions_ask_for_every_partition() -> None:
    want = regions.wanted((), CLUSTERS)
    assert want.partitions == {"lab": None, "hpc": None} and want.bare == ()
    assert want.keeps("hpc", "big")


def test_a_cluster_takes_its_partitions_and_a_partition_only_itself() -> None:
    want = regions.wanted(("lab", "hpc/gpu", "hpc/big", "us-east-1", "eu/x"), CLUSTERS)
    assert want.partitions == {"lab": None, "hpc": frozenset({"gpu", "big"})}
    assert want.keeps("lab", "cpu") and want.keeps("hpc", "big")
    assert not want.keeps("other", "gpu")
    # A bare name that is no cluster may be a partition named alone; eu/x is someone else's.
    assert want.bare == ("us-east-1",)
    assert regions.misnamed(want, PARTITIONS) is None
    # The cluster named as a whole beside one of its partitions: the whole.
    assert regions.wanted(("lab/gpu", "lab"), CLUSTERS).partitions == {"lab": None}


def test_a_partition_named_alone_or_missing_says_what_to_write() -> None:
    alone = regions.wanted(("gpu",), CLUSTERS)
    assert regions.misnamed(alone, PARTITIONS) == (
        "placement.regions: 'gpu' is a partition of cluster hpc: name it hpc/gpu or lab/gpu"
    )
    missing = regions.wanted(("lab/big",), CLUSTERS)
    assert regions.misnamed(missing, PARTITIONS) == (
        "placement.regions: cluster lab has no partition 'big' (partitions: cpu, gpu)"
    )


def test_an_offers_region_is_its_partition_in_its_cluster() -> None:
    assert regions.region("lab", "gpu") == "lab/gpu"
    assert regions.cluster_of("lab/gpu") == "lab" and regions.cluster_of("lab") == "lab"
    assert outer_region("lab/gpu") == "lab" and outer_region("us-east-1") == "us-east-1"


def test_a_blocked_cluster_blocks_its_partitions() -> None:
    blocked = BlockList()
    blocked.block("region", "slurm", "lab")
    assert blocked.why("slurm", "lab/gpu", "gpu") is not None
    assert blocked.why("slurm", "hpc/gpu", "gpu") is None
