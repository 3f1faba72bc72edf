"""The prepare step: booting -> bootstrapping -> ready. Wait for SSH, install and start the
worker, open its reverse tunnel, wait for it to join, and hand the job over once its gang is
ready. Whatever it raises (SSH that never answers within the budget, a failed install) comes
back as data and :func:`~gpulayer.cloud.lifecycle.results.prepare_failed` reads it into the
machine's move to draining.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpulayer.cloud.lifecycle import gangs, planning, step_result
from gpulayer.cloud.lifecycle.links import Link, connect, ssh_target
from gpulayer.cloud.lifecycle.results import error_of, prepare_failed
from gpulayer.cloud.protocol import Instance, node_install_dir, shared_wheelhouse_dir

if TYPE_CHECKING:
    from gpulayer.cloud.lifecycle.records import InstanceRecord
    from gpulayer.cloud.lifecycle.step_result import StepResult
    from gpulayer.cloud.lifecycle.steps.context import StepContext

DEFAULT_PROVISIONING_SECONDS = 600.0
INSTALL_ROOT = "/var/tmp/gpulayer"


@dataclass
class _Opened:
    """What the step opened so far: closed again when it fails."""

    session: Any = None
    link: Link | None = None


def prepare(ctx: StepContext, request_id: str) -> StepResult:
    r = ctx.fresh(request_id)
    if r.state != "booting" or not r.machine or not r.key_path:
        return step_result.skipped("prepare", time.time(), f"the instance is {r.state}")
    spec = ctx.spec_of(r)
    provisioning = spec.placement.provisioning if spec is not None else None
    budget = (
        provisioning.provisioning_timeout_seconds if provisioning else DEFAULT_PROVISIONING_SECONDS
    )
    deadline = (r.launched_at or r.created_at) + budget
    opened = _Opened()
    try:
        return _make_worker(ctx, r, deadline, opened)
    except Exception as exc:
        return _failed(ctx, r, opened, exc)


def _make_worker(
    ctx: StepContext, r: InstanceRecord, deadline: float, opened: _Opened
) -> StepResult:
    machine = r.machine or {}
    key_path = Path(r.key_path or "")
    described = Instance.model_validate(machine)  # what the provider said of the machine
    ctx.note(r.job_id, f"waiting for SSH on {ssh_target(machine, key_path)}")
    session = opened.session = connect(
        machine,
        key_path,
        ctx.keys_dir,
        r.request_id,
        _left(deadline),
        on_progress=lambda text: ctx.note(r.job_id, text),
    )
    install_dir = r.install_dir or node_install_dir(
        # A fleet's machine is made a worker before any job: its dir is named after itself.
        described.install_root or INSTALL_ROOT,
        r.job_id or r.request_id,
        r.node_rank,
    )
    if r.token_hash is not None:
        _clear_earlier_bootstrap(ctx, r, session, install_dir)
    token, token_hash = ctx.service.worker_credential(f"cloud worker {r.request_id}")
    ctx.store.update_instance(r.request_id, token_hash=token_hash, install_dir=install_dir)
    if not ctx.move(r, "bootstrapping", "SSH answered"):
        session.close()
        return step_result.skipped("prepare", time.time(), f"the instance is {r.state}")
    ctx.note(r.job_id, "bootstrapping the worker")
    _bootstrap(ctx, r, described, install_dir, token, deadline, opened)
    worker_id = _wait_for_binding(ctx, r.request_id, deadline)
    if not ctx.move(r, "ready", f"worker {worker_id} joined", ready_at=time.time()):
        # Moved on meanwhile (timed out, or its job ended): its teardown may have run before
        # this link existed, so the worker it started is stopped here.
        ctx.abandon_worker(r.request_id)
        return step_result.skipped("prepare", time.time(), "moved on while bootstrapping")
    ctx.note(r.job_id, f"worker {r.request_id} is ready on {machine['ssh_host']}")
    if r.job_id and gangs.all_ready(r, ctx.gang(r)):
        ctx.service.hand_to_reserved_worker(r.job_id)
    return step_result.done("prepare", time.time(), f"worker {worker_id} joined", move_to="ready")


def _bootstrap(
    ctx: StepContext,
    r: InstanceRecord,
    described: Instance,
    install_dir: str,
    token: str,
    deadline: float,
    opened: _Opened,
) -> None:
    from gpulayer.cloud.bootstrap import BootstrapPlan, bootstrap_worker
    from gpulayer.cloud.wheelhouse import build_wheelhouse

    machine = r.machine or {}
    # One wheelhouse per gpulayer version and platform in the user cache, shared by every
    # GPULAYER_HOME; a first build says what it builds into the job's log as it goes.
    wheelhouse = build_wheelhouse(on_progress=lambda line: ctx.note(r.job_id, line))
    plan = BootstrapPlan(
        install_dir=install_dir,
        control_plane_port=ctx.control_port,
        worker_token=token,
        worker_name=r.request_id,
        labels={
            "gpulayer.request": r.request_id,
            **({"gpulayer.job": r.job_id} if r.job_id else {"gpulayer.fleet": r.fleet or ""}),
        },
        provider=r.provider,
        region=r.region,
        zone=r.zone,
        hourly_price=r.hourly_price,
        currency=r.currency,
        deadman_seconds=ctx.deadman_seconds(),
        deadman_action=ctx.deadman_action(r.provider),
        python=described.python or "python3",
        hand_off=described.worker_start == "launcher",
        tunnel_address=described.tunnel_address,
        instance_request_id=r.request_id,
        system_site_packages=bool(ctx.settings.get("system_site_packages", False)),
        wheelhouse_dir=shared_wheelhouse_dir(described.shared_dir, wheelhouse.key),
        # The other nodes of a gang reach this one where the provider says it is; a lone
        # machine too, as it may be a gang's node once it is warm.
        node_address=str(machine.get("private_ip") or machine["ssh_host"]),
    )
    remote = bootstrap_worker(
        opened.session,
        plan,
        wheelhouse,
        on_output=lambda line: ctx.note(r.job_id, line),
        timeout=_left(deadline),
    )
    opened.link = Link(opened.session, remote.tunnel, install_dir)
    ctx.links.put(r.request_id, opened.link)
    ctx.store.update_instance(r.request_id, tunnel_port=remote.remote_port)


def _failed(ctx: StepContext, r: InstanceRecord, opened: _Opened, exc: Exception) -> StepResult:
    if opened.link is not None:
        ctx.links.close(r.request_id)
    elif opened.session is not None:
        opened.session.close()
    at = time.time()
    error = error_of(exc)
    reading = prepare_failed(
        error,
        in_gang=r.launch_id is not None,
        node_rank=r.node_rank,
        label=_label(r),
        place=r.zone or r.region,
        key_file=Instance.model_validate(r.machine).job_key_file if r.machine else None,
    )
    columns = reading.end.columns()
    if reading.charge_ends:
        columns["ended_at"] = at  # its teardown keeps this end: the ledger stops here
    current = ctx.fresh(r.request_id)
    moved = None
    if current.state in ("booting", "bootstrapping") and ctx.move(
        current, "draining", reading.reason, **columns
    ):
        moved = "draining"
    if reading.charge_ends and r.launch_id is not None:
        # A gang without this node was never usable: none of its nodes is charged on.
        for node in ctx.gang(r):
            if node.ended_at is None and not node.gone:
                ctx.store.update_instance(node.request_id, ended_at=at)
    ctx.note(r.job_id, reading.note)
    return step_result.failed("prepare", at, error, move_to=moved)


def _clear_earlier_bootstrap(
    ctx: StepContext, r: InstanceRecord, session: Any, install_dir: str
) -> None:
    """A restart cut a bootstrap off: end what it started, so the new one starts clean."""
    from gpulayer.cloud.bootstrap import remove_command, stop_command

    for command in (stop_command(install_dir, 2), remove_command(install_dir)):
        with contextlib.suppress(Exception):
            session.run(command, timeout=60)
    if r.token_hash:
        ctx.store.remove_token(r.token_hash)
    worker_id = ctx.worker_of(r.request_id)
    if worker_id:
        ctx.service.retire_worker(worker_id)
    ctx.note(r.job_id, f"instance {r.request_id}: cleared the bootstrap a restart cut off")


def _wait_for_binding(ctx: StepContext, request_id: str, deadline: float) -> str:
    while True:
        worker_id = ctx.worker_of(request_id)
        if worker_id:
            return worker_id
        _left(deadline, "the worker did not join the control plane in time")
        ctx.service.wait_for_change(ctx.service.version, 0.5)


def _left(deadline: float, why: str = "provisioning_timeout_seconds ran out") -> float:
    from gpulayer.cloud.errors import ProvisionTimeout

    left = deadline - time.time()
    if left <= 0:
        raise ProvisionTimeout(why)
    return left


def _label(r: InstanceRecord) -> str:
    if r.offer:
        return planning.key_label(planning.offer_key(r.offer))
    return f"{r.provider}/{r.zone or r.region}/{r.instance_type}"
