"""Cloud gangs, pure parts: a partial gang blocks its zone for good, the gang's records say
when a node ends with the others, when the job may be handed over and who terminates."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from gpulayer.cloud.lifecycle import gangs, planning
from gpulayer.cloud.offer import Offer
from gpulayer.cloud.protocol import node_install_dir


def offer(name: str, zone: str) -> Offer:
    return Offer(
        provider="aws", instance_type=name, region="r1", zone=zone, cpu_cores=2, hourly_price=1.0
    )


@dataclass
class Node:
    request_id: str
    state: str
    node_rank: int
    launch_id: str | None = "r0"


def test_a_partial_gang_blocks_its_zone_for_the_job_even_after_capacity_frees() -> None:
    a, b, elsewhere = offer("a", "z1"), offer("b", "z1"), offer("c", "z2")
    end = planning.partial("zone", "node 1 no SSH")
    found = planning.past_try(
        SimpleNamespace(
            job_id="j-1",
            offer=a.model_dump(mode="json"),
            outcome=end.outcome,
            outcome_scope=end.scope,
            outcome_message=end.message,
            hold_until=None,
            created_at=100.0,
            ended_at=100.0,
        )
    )
    assert found is not None and (found.outcome, found.scope) == ("partial", "zone")
    later = planning.choose([a, b, elsewhere], [found], now=10_000, capacity_freed_at=9_000)
    assert later.offer == elsewhere
    none_left = planning.choose([a, b], [found], now=10_000)
    assert none_left.offer is None and none_left.wait is None
    assert none_left.give_up == "every offer failed: aws/z1/a: node 1 no SSH"


def test_a_node_ends_with_its_gang_once_another_is_ending_or_gone() -> None:
    gang = [Node("r0", "booting", 0), Node("r1", "bootstrapping", 1)]
    assert gangs.broken_by(gang[0], gang) is None
    gang[1].state = "draining"
    assert gangs.broken_by(gang[0], gang) == "node 1 of its gang is draining"
    assert gangs.broken_by(gang[1], gang) is None  # it is on its way already
    alone = Node("r9", "in_use", 0, launch_id=None)
    assert gangs.broken_by(alone, [alone]) is None


def test_a_gang_is_handed_over_when_every_node_is_ready() -> None:
    gang = [Node("r0", "ready", 0), Node("r1", "bootstrapping", 1)]
    assert not gangs.all_ready(gang[0], gang)
    gang[1].state = "ready"
    assert gangs.all_ready(gang[0], gang)


def test_the_lowest_node_terminates_the_gang_once_every_node_is_terminating() -> None:
    gang = [Node("r0", "terminated", 0), Node("r1", "terminating", 1), Node("r2", "draining", 2)]
    assert gangs.terminate_leader(gang[1], gang) is None  # node 2 is not there yet
    gang[2].state = "terminating"
    assert gangs.terminate_leader(gang[1], gang) is True
    assert gangs.terminate_leader(gang[2], gang) is False
    assert [n.request_id for n in gangs.terminating(gang)] == ["r1", "r2"]


def test_every_node_installs_in_a_dir_of_its_own() -> None:
    assert node_install_dir("/var/tmp/gpulayer", "j-1") == "/var/tmp/gpulayer/j-1"
    assert node_install_dir("/var/tmp/gpulayer", "j-1", 2) == "/var/tmp/gpulayer/j-1-node2"


class OneMachineAtATime:
    """A provider plugin that launches lone machines only (no launch_gang)."""

    def offers(self, query: object) -> list[Offer]:
        raise AssertionError("no search: the refusal comes first")

    def launch(self, offer: Offer, request: object) -> object:
        raise AssertionError("nothing is launched")


def test_a_gang_with_only_providers_that_cannot_launch_one_is_refused_before_any_search(
    tmp_path: Path,
) -> None:
    from gpulayer_aws import AwsProvider
    from gpulayer_gcp import GcpProvider

    from gpulayer.cloud.lifecycle.placement import gang_refusal
    from gpulayer.cloud.protocol import GangProvider
    from gpulayer.spec import JobSpec

    # Every shipped cloud launches gangs; a plugin that cannot is refused before a search.
    gcp = GcpProvider({"endpoint_url": "http://127.0.0.1:9", "cache_dir": str(tmp_path)})
    aws = AwsProvider({"cache_dir": str(tmp_path)})
    assert isinstance(gcp, GangProvider) and isinstance(aws, GangProvider)
    solo = OneMachineAtATime()
    assert not isinstance(solo, GangProvider)
    spec = JobSpec.model_validate(
        {
            "workload": {"kind": "distributed", "entrypoint": "t.py", "num_workers": 2},
            "placement": {"target": "cloud"},
        }
    )
    assert gang_refusal(spec, {"solo": solo}, []) == (
        "num_workers: 2 nodes need a provider that launches machines together, "
        "and none is enabled (solo cannot)"
    )
