"""The slurm provider: gpulayer's provider verbs on Slurm clusters.

Offers come from ``scontrol`` on each cluster's login node, one per partition and node shape.
A launch is one ``sbatch`` allocation of whole nodes (N for a gang), written down before it is
submitted and tagged in its name and comment; pending in the queue is waiting for capacity,
with Slurm's reason, until ``pending_timeout_seconds``. Once it runs, each node is an instance
reached over SSH (the cluster's shared home carries the job's key to the nodes), where the
worker is installed and started inside the allocation like on any rented machine. A job that
ended by itself ends its allocation COMPLETED (:meth:`SlurmProvider.finish`: the batch script
returns); terminate is ``scancel``; the allocation's time limit ends it if everything else fails.
Every command on a login node goes over the one connection kept to it.
"""

from __future__ import annotations

import datetime as dt
import getpass
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from gpulayer.cloud import (
    CapacityError,
    FinishingProvider,
    GangProvider,
    Instance,
    JobKeyFile,
    JobKeyLogin,
    LaunchRequest,
    Offer,
    OfferQuery,
    OutlivesReclaim,
    ProviderError,
    load_settings,
)
from gpulayer_slurm import arrays, batch, parsing, queue_states, regions
from gpulayer_slurm.allocations import (
    Allocation,
    AllocationStore,
    instance_id,
    split_instance_id,
)
from gpulayer_slurm.ending import ENDED, JOB_NAME_PREFIX, POLL_SECONDS, Ending
from gpulayer_slurm.errors import PROVIDER, ClusterUnreachable, SlurmCommandError
from gpulayer_slurm.login import LoginNode, add_key_command
from gpulayer_slurm.offers import PartitionShape, offered_partitions, partition_shapes
from gpulayer_slurm.reach import install_root_of, over_ssh, reach_nodes
from gpulayer_slurm.settings import SlurmCluster, SlurmProviderSettings

log = logging.getLogger("gpulayer.providers.slurm")

_SEPARATOR = "----gpulayer-slurm----"
SHOW_CLUSTER = f"scontrol -o show partition && echo {_SEPARATOR} && scontrol -o show node"
INSTALL_ROOT_TAG = "gpulayer:install-root"
PYTHON_TAG = "gpulayer:python"
NODE_RANK_TAG = "gpulayer:node-rank"
GANG_SIZE_TAG = "gpulayer:gang-size"
SLURM_JOB_TAG = "gpulayer:slurm-job"
SLURM_NODE_TAG = "gpulayer:slurm-node"


class SlurmProvider(GangProvider, FinishingProvider, OutlivesReclaim):
    """Slurm clusters. Settings: see :class:`gpulayer_slurm.settings.SlurmProviderSettings`.

    A preempted allocation's node runs on (for another job), so its machines outlive a
    reclaim: the worker is stopped over SSH."""

    settings_model = SlurmProviderSettings
    """What providers.yaml's section for this provider is validated into."""

    name = PROVIDER

    def __init__(self, settings: SlurmProviderSettings | Mapping[str, Any] | None = None) -> None:
        self.settings = load_settings(SlurmProviderSettings, settings, provider=PROVIDER)
        self._state = self.settings.resolved_state_dir()
        self.allocations = AllocationStore(self._state / "allocations")
        self._ending = Ending(self.allocations, self._queued)

    def login(self, cluster: str) -> LoginNode:
        found = self.settings.clusters.get(cluster)
        if found is None:
            known = ", ".join(sorted(self.settings.clusters))
            raise ProviderError(
                f"no cluster named {cluster!r} (clusters: {known})", provider=PROVIDER
            )
        return LoginNode(
            cluster,
            found,
            host_keys_dir=self._state / "host-keys",
            connect_timeout=self.settings.connect_timeout_seconds,
            command_timeout=self.settings.command_timeout_seconds,
        )

    def job_key_logins(self) -> list[JobKeyLogin]:
        """Each cluster's login node (not `local`), with the file a launch writes the job key
        to there for the nodes to accept (`gpulayer config check` tries a key written there)."""
        from gpulayer.cloud import SshTarget

        return [
            JobKeyLogin(
                f"{PROVIDER} {name} login node",
                SshTarget(c.login, c.port, c.user, key_path=c.key_file, host_key=c.host_key),
                _job_key_file(name, c),
                self._state / "host-keys",
            )
            for name, c in self.settings.clusters.items()
            if not c.local and c.user is not None and c.key_file is not None
        ]

    # --- offers -------------------------------------------------------------------------------

    def partition_shapes(self, cluster: str) -> list[PartitionShape]:
        """Every offer of ``cluster`` with its time limit and idle node count."""
        return self._read_cluster(cluster).shapes

    def _read_cluster(self, cluster: str) -> _ClusterView:
        text = self.login(cluster).checked(SHOW_CLUSTER, what="scontrol show partition/node")
        partitions_text, _, nodes_text = text.partition(_SEPARATOR)
        try:
            partitions = parsing.parse_partitions(partitions_text)
            nodes = parsing.parse_nodes(nodes_text)
        except ValueError as exc:
            raise ProviderError(
                f"{cluster}: cannot read scontrol: {exc}", provider=PROVIDER
            ) from exc
        settings = self.settings.clusters[cluster]
        return _ClusterView(
            partition_shapes(cluster, settings, partitions, nodes),
            offered_partitions(settings, partitions),
        )

    def offers(self, query: OfferQuery) -> list[Offer]:
        """One offer per partition and node shape of every cluster, or of those
        ``query.regions`` names (``CLUSTER`` or ``CLUSTER/PARTITION``). Clusters that do not
        answer are left out and logged; when none answers, the error says why for each. A
        region naming a partition wrongly is an error saying what to write."""
        want = regions.wanted(query.regions, self.settings.clusters)
        # A region that names no cluster may be a partition named alone: the clusters are
        # read to tell (and a failure to read one is then no error of the query's).
        names = list(self.settings.clusters) if want.bare else list(want.partitions)
        if not names:
            return []
        with ThreadPoolExecutor(max_workers=min(8, len(names))) as pool:
            found = dict(zip(names, pool.map(self._view_or_reason, names), strict=True))
        views = {n: v for n, v in found.items() if not isinstance(v, str)}
        wrong = regions.misnamed(want, {n: v.partitions for n, v in views.items()})
        if wrong is not None:
            raise ProviderError(wrong, provider=PROVIDER)
        reasons = [r for n, r in found.items() if isinstance(r, str) and n in want.partitions]
        if reasons and len(reasons) == len(want.partitions):
            raise ProviderError(f"no cluster answers: {'; '.join(reasons)}", provider=PROVIDER)
        return [
            s.offer
            for name, view in views.items()
            for s in view.shapes
            if want.keeps(name, s.partition)
        ]

    def _view_or_reason(self, cluster: str) -> _ClusterView | str:
        try:
            return self._read_cluster(cluster)
        except (ClusterUnreachable, SlurmCommandError) as exc:
            log.warning("slurm cluster %s offers nothing: %s", cluster, exc.message)
            return f"{cluster}: {exc.message}"

    # --- instances ----------------------------------------------------------------------------

    def launch(self, offer: Offer, request: LaunchRequest) -> Instance:
        if request.count != 1:
            raise ProviderError(
                "launch allocates one node; a gang goes to launch_gang", provider=PROVIDER
            )
        return self._allocate(offer, request)[0]

    def launch_gang(self, offer: Offer, request: LaunchRequest) -> list[Instance]:
        """One allocation of ``request.count`` nodes of the offer's shape; the instances in
        SLURM_NODEID order (node 0 is where the gang meets)."""
        return self._allocate(offer, request)

    def launch_array(
        self, offer: Offer, requests: Sequence[LaunchRequest], limit: int | None
    ) -> list[str]:
        """One Slurm job array for ``requests`` (see :mod:`gpulayer_slurm.arrays`); each
        task's own ``launch`` then waits for it to run."""
        return arrays.submit_array(self, offer, requests, limit)

    def _allocate(self, offer: Offer, request: LaunchRequest) -> list[Instance]:
        if offer.provider != PROVIDER:
            raise ProviderError(f"offer {offer.label} is not a slurm offer", provider=PROVIDER)
        cluster_name = regions.cluster_of(offer.region)
        login = self.login(cluster_name)
        partition = offer.zone
        if partition is None:
            raise ProviderError(f"offer {offer.label} names no partition", provider=PROVIDER)
        record = self.allocations.read(request.request_id)
        if record is not None and record.slurm_job_id is None:
            # Written down, then no answer from sbatch: it may have gone through.
            found = self._queued(login, name=record.job_name)
            if found:
                record.slurm_job_id = found[0].job_id
                self.allocations.write(record)
        if record is None or record.slurm_job_id is None:
            record = self._submit(login, offer, partition, request)
        if record.instances:
            return [Instance.model_validate(i) for i in record.instances]
        running = self._wait_running(login, record, request)
        instances = self._instances(login, record, running, offer, request)
        record.instances = [i.model_dump(mode="json") for i in instances]
        record.node_names = list(running.nodes)
        record.ran = True
        self.allocations.write(record)
        return instances

    def _submit(
        self, login: LoginNode, offer: Offer, partition: str, request: LaunchRequest
    ) -> Allocation:
        tags = dict(request.tags)
        if request.count > 1:
            tags.setdefault(GANG_SIZE_TAG, str(request.count))
        adding = "adding the job's key to authorized_keys"
        login.checked(add_key_command(login, request), what=adding)
        record = Allocation(
            request_id=request.request_id,
            job_id=request.job_id,
            cluster=login.name,
            partition=partition,
            instance_type=offer.instance_type,
            nodes=request.count,
            tags=tags,
            name=request.job_name,
        )
        self.allocations.write(record)  # before sbatch: a crash leaves a record to find
        command = batch.sbatch_command(
            job_name=record.job_name,
            tags=tags,
            job_id=request.job_id,
            **self.sbatch_shape(login, offer, partition, request),
        )
        done = login.run(command, once=True)
        job_id = done.stdout.strip().split(";")[0]
        if done.exit_code != 0 or not job_id.isdigit():
            # Slurm refused it: nothing was queued.
            self.forget(login, record)
            why = " | ".join((done.stderr or done.stdout).strip().splitlines()[-2:])
            raise CapacityError(
                "zone", PROVIDER, offer.region, partition, f"sbatch refused the allocation: {why}"
            )
        record.slurm_job_id = job_id
        self.allocations.write(record)
        if request.progress is not None:
            request.progress(f"slurm job {job_id} submitted to {login.name}/{partition}")
        return record

    def sbatch_shape(
        self, login: LoginNode, offer: Offer, partition: str, request: LaunchRequest
    ) -> dict[str, Any]:
        """What of ``sbatch_command`` the offer and the request's limits say: the nodes,
        their part, the time limit within the partition's, account and qos."""
        cluster = login.cluster
        shapes = self.partition_shapes(login.name)
        shape = _shape_of(shapes, offer, partition, request.count)
        time_limit = None
        if request.time_limit_seconds is not None:
            wanted = int(request.time_limit_seconds + self.settings.time_margin_seconds)
            if shape.max_time_seconds is not None:
                wanted = min(wanted, shape.max_time_seconds)
            time_limit = parsing.format_duration(wanted)
        return {
            "partition": partition,
            "nodes": request.count,
            "gpus_per_node": offer.gpu_count,
            "account": cluster.account,
            "qos": cluster.qos,
            "time_limit": time_limit,
            "install_root": install_root_of(login),
            "exclude": sorted(
                {n for s in shapes if s.partition == partition for n in s.nodes} - {*shape.nodes}
            ),
            "share": _share(shape),
        }

    def _wait_running(
        self, login: LoginNode, record: Allocation, request: LaunchRequest
    ) -> parsing.QueuedJob:
        """Until the allocation runs; pending longer than pending_timeout_seconds (or the job's
        provisioning_timeout_seconds) is a lack of capacity (the allocation is cancelled), gone
        from the queue is a failed launch."""
        patience = self.settings.pending_timeout_seconds
        if request.provisioning_timeout_seconds is not None:
            patience = min(patience, request.provisioning_timeout_seconds)
        deadline = time.monotonic() + patience
        said = None
        while True:
            job = next(
                (j for j in self._queued(login, name=record.job_name)
                 if j.job_id == record.slurm_job_id),
                None,
            )  # fmt: skip
            if job is None or job.state in ENDED:
                state = job.state if job is not None else "gone from the queue"
                # Ended from outside (or by a terminate meanwhile): its key goes with it.
                self._ending.remove_key(login, record)
                raise ProviderError(
                    f"slurm job {record.slurm_job_id} ended before it ran ({state})",
                    provider=PROVIDER,
                )
            if job.state == "RUNNING" and len(job.nodes) == record.nodes:
                return job
            reason = queue_states.pending_note(record.slurm_job_id, job)
            if reason != said and request.progress is not None:
                request.progress(reason)
            said = reason
            if job.reason == queue_states.ARRAY_WAIT_REASON:
                # Held by its own array's %LIMIT: its patience starts once Slurm would run it.
                deadline = time.monotonic() + patience
            if time.monotonic() > deadline:
                self._ending.cancel(login, [record])
                raise CapacityError(
                    "zone", PROVIDER, record.region, record.partition,
                    f"slurm job {record.slurm_job_id} still pending after {patience:g} s "
                    f"({job.reason})",
                )  # fmt: skip
            time.sleep(POLL_SECONDS)

    def _instances(
        self,
        login: LoginNode,
        record: Allocation,
        job: parsing.QueuedJob,
        offer: Offer,
        request: LaunchRequest,
    ) -> list[Instance]:
        cluster = login.cluster
        text = login.checked(batch.node_addresses_command(job.nodes), what="scontrol show node")
        address = {n.name: n.address for n in parsing.parse_nodes(text)}
        user = cluster.user or getpass.getuser()
        assert record.slurm_job_id is not None
        install_root = install_root_of(login)
        now = dt.datetime.now(dt.timezone.utc)
        # Slurm ends the allocation at its time limit: a warm one takes only jobs that end
        # before that.
        ends_at = None if job.time_left is None else now + dt.timedelta(seconds=job.time_left)
        reach = reach_nodes(login)
        instances = []
        for rank, node in enumerate(job.nodes):
            tags = {
                **record.tags,
                INSTALL_ROOT_TAG: install_root,
                PYTHON_TAG: cluster.python or "python3",
                SLURM_JOB_TAG: record.slurm_job_id,
                SLURM_NODE_TAG: node,
            }
            if record.nodes > 1:
                tags[NODE_RANK_TAG] = str(rank)
            instances.append(
                Instance(
                    id=instance_id(record.cluster, record.slurm_job_id, rank),
                    provider=PROVIDER,
                    region=record.region,
                    zone=record.partition,
                    state="running",
                    instance_type=record.instance_type,
                    private_ip=address.get(node, node),
                    ssh_user=user,
                    **(reach or over_ssh(login, address.get(node, node))),
                    hourly_price=offer.hourly_price,
                    currency=offer.currency,
                    tags=tags,
                    launched_at=now,
                    install_root=install_root,
                    python=cluster.python or "python3",
                    # The allocation's step on the node starts the worker (batch.node_launcher).
                    worker_start="launcher",
                    shared_dir=cluster.shared_dir,
                    job_key_file=_job_key_file(record.cluster, cluster),
                    ends_at=ends_at,
                )
            )
        return instances

    def describe(self, ids: Sequence[str]) -> list[Instance]:
        wanted = [(i, split_instance_id(i)) for i in dict.fromkeys(ids)]
        queues: dict[str, dict[str, parsing.QueuedJob]] = {}
        found = []
        for given, parts in wanted:
            if parts is None or parts[0] not in self.settings.clusters:
                continue
            cluster, job_id, rank = parts
            if cluster not in queues:
                # How it ended tells a preemption (PREEMPTED) from a loss (NODE_FAIL...).
                queued = self._queued(self.login(cluster), ended_too=True)
                queues[cluster] = {j.job_id: j for j in queued}
            record = self.allocations.by_slurm_job(cluster, job_id)
            job = queues[cluster].get(job_id)
            if record is None and job is None:
                continue
            found.append(self._described(given, cluster, rank, record, job))
        return found

    def _described(
        self,
        given: str,
        cluster: str,
        rank: int,
        record: Allocation | None,
        job: parsing.QueuedJob | None,
    ) -> Instance:
        state, reclaimed = queue_states.instance_state(job, ran=record is not None and record.ran)
        if record is not None and record.cancelled:
            reclaimed = False
        if record is not None and rank < len(record.instances):
            base = Instance.model_validate(record.instances[rank])
            return base.model_copy(update={"state": state, "reclaimed": reclaimed})
        tags = batch.parse_comment(job.comment) if job is not None else {}
        return Instance(
            id=given,
            provider=PROVIDER,
            region=record.region if record is not None else cluster,
            zone=record.partition if record is not None else None,
            state=state,
            ssh_user=self.settings.clusters[cluster].user or getpass.getuser(),
            tags=record.tags if record is not None else tags,
            reclaimed=reclaimed,
        )

    def terminate(self, ids: Sequence[str]) -> None:
        """scancel each instance's allocation (all its nodes end together: CANCELLED), wait
        until Slurm has ended it, and take the job's key off the login node. Gone already is
        fine. For a job that ended by itself, :meth:`finish` ends it COMPLETED instead."""
        self._end(ids, lambda login, records: self._ending.cancel(login, records))

    def finish(self, ids: Sequence[str]) -> None:
        """End the allocations of instances whose job ended by itself (and whose worker was
        stopped): each batch script is told to return, so the allocation ends COMPLETED;
        ``scancel`` only for one still pending, or one not ended after finish_wait_seconds.
        Then the job's key leaves the login node. Gone already is fine."""
        patience = self.settings.finish_wait_seconds
        self._end(ids, lambda login, records: self._ending.finish(login, records, patience))

    def _end(self, ids: Sequence[str], how: Callable[[LoginNode, list[Allocation]], None]) -> None:
        """End the allocations of ``ids`` whose every node is let go of by now; one whose
        other nodes still serve is left to end with the last of them (an error says so)."""
        by_cluster: dict[str, dict[str, set[int]]] = {}
        for given in ids:
            parts = split_instance_id(given)
            if parts is not None and parts[0] in self.settings.clusters:
                cluster, job_id, rank = parts
                by_cluster.setdefault(cluster, {}).setdefault(job_id, set()).add(rank)
        failures = []
        for cluster, jobs in by_cluster.items():
            records = []
            live: set[str] | None = None
            for job_id, ranks in sorted(jobs.items()):
                record = self.allocations.by_slurm_job(cluster, job_id)
                held = [] if record is None else self._release(record, ranks)
                if held and live is None:
                    # One Slurm has ended already (a preemption, a lost node) has no node
                    # left to wait for.
                    queued = self._queued(self.login(cluster))
                    live = {j.job_id for j in queued if j.state not in ENDED}
                if held and live is not None and job_id in live:
                    failures.append(
                        f"slurm job {job_id} ends with its other nodes (ranks "
                        f"{', '.join(map(str, held))} still held)"
                    )
                    continue
                records.append(record or _unrecorded(cluster, job_id))
            try:
                if records:
                    how(self.login(cluster), records)
            except ProviderError as exc:
                failures.append(exc.message)
        if failures:
            raise ProviderError("; ".join(failures), provider=PROVIDER)

    def _release(self, record: Allocation, ranks: set[int]) -> list[int]:
        """Record ``ranks`` as let go of; the ranks still held. Each call adds its own ranks
        again, so calls for different nodes that race still end it on a later retry."""
        if record.nodes <= 1:
            return []
        record.released = sorted({*record.released, *ranks})
        self.allocations.write(record)
        return [r for r in range(record.nodes) if r not in record.released]

    def queued(self, login: LoginNode, name: str) -> list[parsing.QueuedJob]:
        return self._queued(login, name=name)

    def forget(self, login: LoginNode, record: Allocation) -> None:
        self._ending.remove_key(login, record)
        self.allocations.remove(record.request_id)

    def list_owned(self, tags: Mapping[str, str]) -> list[Instance]:
        """Allocations still queued or running whose comment carries all of ``tags``: one
        instance per node."""
        if not tags:
            # Without a tag every gpulayer allocation would match, and a reaper would end them.
            raise ProviderError("list_owned needs at least one tag to match", provider=PROVIDER)
        found = []
        for cluster in self.settings.clusters:
            try:
                queued = self._queued(self.login(cluster))
            except ClusterUnreachable as exc:
                log.warning("slurm cluster %s not listed: %s", cluster, exc.message)
                continue
            for job in queued:
                if not job.name.startswith(JOB_NAME_PREFIX) or job.state in ENDED:
                    continue
                carried = batch.parse_comment(job.comment)
                if any(carried.get(k) != v for k, v in tags.items()):
                    continue
                record = self.allocations.by_slurm_job(cluster, job.job_id)
                size = int(carried.get(GANG_SIZE_TAG, "1") or 1)
                for rank in range(max(size, len(job.nodes), 1)):
                    given = instance_id(cluster, job.job_id, rank)
                    found.append(self._described(given, cluster, rank, record, job))
        return found

    def _queued(
        self, login: LoginNode, *, name: str | None = None, ended_too: bool = False
    ) -> list[parsing.QueuedJob]:
        text = login.checked(batch.squeue_command(name=name, ended_too=ended_too), what="squeue")
        try:
            return parsing.parse_squeue(text)
        except ValueError as exc:
            raise ProviderError(
                f"{login.name}: cannot read squeue: {exc}", provider=PROVIDER
            ) from exc


def _shape_of(
    shapes: list[PartitionShape], offer: Offer, partition: str, count: int
) -> PartitionShape:
    """The offer's shape as the cluster has it now, with ``count`` nodes."""
    shape = next(
        (s for s in shapes if s.partition == partition and s.instance_type == offer.instance_type),
        None,
    )
    if shape is None:
        raise CapacityError(
            "zone", PROVIDER, offer.region, partition,
            f"partition {partition} has no usable node of shape {offer.instance_type} now",
        )  # fmt: skip
    if len(shape.nodes) < count:
        raise CapacityError(
            "zone", PROVIDER, offer.region, partition,
            f"{count} nodes of {offer.instance_type} asked, partition {partition} "
            f"has {len(shape.nodes)}",
        )  # fmt: skip
    return shape


def _share(shape: PartitionShape) -> batch.Share | None:
    part = shape.shape
    if not part.shared:
        return None
    return batch.Share(part.cpus, part.memory_mb, part.gpu_type if part.typed else None)


@dataclass(frozen=True)
class _ClusterView:
    shapes: list[PartitionShape]
    partitions: list[str]
    """Every partition gpulayer may submit to, with usable nodes or not."""


def _unrecorded(cluster: str, slurm_job_id: str) -> Allocation:
    # A job this controller has no record of (its state dir lost): found by id alone.
    return Allocation(
        request_id="",
        job_id="",
        cluster=cluster,
        partition="",
        instance_type="",
        nodes=1,
        slurm_job_id=slurm_job_id,
    )


def _job_key_file(name: str, cluster: SlurmCluster) -> JobKeyFile:
    return JobKeyFile(
        path=cluster.authorized_keys, setting=f"{PROVIDER}.clusters[{name}].authorized_keys"
    )
