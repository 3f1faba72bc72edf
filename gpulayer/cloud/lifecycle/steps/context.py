"""What every step and the pass share: the store and the control plane's port, the links, the
providers, and the effects that change an instance (a recorded move, a release, a lost worker,
its keys removed once it is gone), each one state change with its reason. The pass carries out
the decision's actions here too, so a step and the pass move an instance the same way."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpulayer.cloud.lifecycle import planning
from gpulayer.cloud.lifecycle.decide import (
    Action,
    EndGangNode,
    HandOver,
    LoseWorker,
    MarkReachable,
    MarkUnreachable,
    Move,
    Release,
    RememberReclaim,
    Rest,
    Step,
    Submit,
)
from gpulayer.cloud.lifecycle.links import Links, host_keys_path
from gpulayer.cloud.lifecycle.states import check_transition

if TYPE_CHECKING:
    from gpulayer.cloud.fleets import FleetSettings
    from gpulayer.cloud.lifecycle.ports import InstanceStore, JobPort
    from gpulayer.cloud.lifecycle.records import InstanceRecord
    from gpulayer.cloud.lifecycle.step_result import StepResult
    from gpulayer.cloud.protocol import Provider
    from gpulayer.spec import JobSpec

log = logging.getLogger("gpulayer.lifecycle")

ProvidersLoader = Callable[[tuple[str, ...]], Mapping[str, "Provider"]]
"""The enabled providers (those named, when any are): a control plane's ProviderRegistry
builds each once per settings change, so asking at every step costs a file read."""

DEFAULT_DEADMAN_SECONDS = 600.0
HOLD_RECLAIMED_SECONDS = 600.0
RECLAIMED = "reclaimed by the provider"


@dataclass
class StepContext:
    service: JobPort
    control_port: int
    owner: str
    load_providers: ProvidersLoader
    settings_of: Callable[[], Mapping[str, Any]]
    links: Links
    wake: Callable[[], None]
    """Called after every move: the loop looks again at once."""

    @property
    def store(self) -> InstanceStore:
        return self.service.store

    @property
    def keys_dir(self) -> Path:
        return self.service.layout.root / "keys"

    @property
    def settings(self) -> Mapping[str, Any]:
        """Read at each use, so an edited providers.yaml applies to the next step."""
        return self.settings_of()

    # --- reads ---------------------------------------------------------------------------------

    def fresh(self, request_id: str) -> InstanceRecord:
        return self.store.get_instance(request_id)

    def provider(self, r: InstanceRecord) -> Provider | None:
        try:
            return self.load_providers((r.provider,)).get(r.provider)
        except Exception as exc:
            log.warning("instance %s: provider %s: %s", r.request_id, r.provider, exc)
            return None

    def gang(self, r: InstanceRecord) -> list[InstanceRecord]:
        """The records launched with ``r`` (itself included); just ``r`` when it is alone."""
        if r.launch_id is None:
            return [r]
        return [i for i in self.store.list_instances(job_id=r.job_id) if i.launch_id == r.launch_id]

    def worker_of(self, request_id: str) -> str | None:
        reservation = self.store.reservation(request_id)
        return reservation.worker_id if reservation is not None else None

    def deadman_seconds(self) -> float:
        return float(self.settings.get("deadman_seconds", DEFAULT_DEADMAN_SECONDS))

    def idle_seconds(self, provider: str) -> float:
        """How long the provider's machines stay warm after their job (0: not at all)."""
        own = (self.settings.get("provider_idle_seconds") or {}).get(provider)
        return float(self.settings.get("idle_seconds", 0) if own is None else own)

    def fleet(self, name: str | None) -> FleetSettings | None:
        """The fleet of that name as configured now (None: not, or no longer)."""
        for fleet in self.settings.get("fleets") or ():
            if fleet.name == name:
                return fleet
        return None

    def spec_of(self, r: InstanceRecord) -> JobSpec | None:
        """What the machine was asked for: its job's spec, or a fleet's machine's that no job
        took yet, its fleet's (None: its fleet is no longer configured)."""
        from gpulayer.spec import JobSpec

        if r.job_id:
            return JobSpec.model_validate(self.store.get_job(r.job_id).spec)
        from gpulayer.cloud.fleets import fleet_spec

        fleet = self.fleet(r.fleet)
        return None if fleet is None else fleet_spec(fleet)

    def deadman_action(self, provider: str) -> str:
        configured = os.environ.get("GPULAYER_DEADMAN_ACTION") or self.settings.get(
            "deadman_action"
        )
        if configured:
            return str(configured)
        # Powering off is how a cloud instance stops billing; on a host we do not own (an ssh
        # host, a Slurm node, whose allocation ends by its time limit), only the worker stops.
        return "stop" if provider in ("ssh", "slurm") else "poweroff"

    # --- effects -------------------------------------------------------------------------------

    def note(self, job_id: str, text: str) -> None:
        if not job_id:  # a fleet's machine no job took yet: the controller's log only
            log.info("%s", text)
            return
        self.service.log_system(job_id, 0, [text])

    def keep(self, request_id: str, result: StepResult) -> None:
        """Store what the step found with its instance."""
        self.store.update_instance(request_id, **result.columns())

    def move(self, r: InstanceRecord, to: str, reason: str, **values: Any) -> bool:
        check_transition(r.state, to)
        moved = self.store.move_instance(
            r.request_id, expect=r.state, to=to, reason=reason, **values
        )
        if moved:
            log.info("instance %s: %s -> %s (%s)", r.request_id, r.state, to, reason)
            r.state = to
            self.wake()
        return moved

    def release(self, r: InstanceRecord, why: str) -> None:
        """The job is done with the instance: no one may be dispatched to its worker now."""
        self.store.release_reservation(r.request_id)
        self.move(r, "draining", why)

    def rest(self, r: InstanceRecord, why: str) -> None:
        """The job is done with the instance, which stays warm: its worker runs on, reserved
        for no job, until a job takes it or its idle_seconds pass."""
        if self.store.rest_reservation(r.request_id):
            kept = (
                f"kept warm by fleet {r.fleet}"
                if r.fleet
                else f"kept warm for {self.idle_seconds(r.provider):g} s"
            )
            self.move(r, "idle", f"{why}; {kept}")
        else:  # released meanwhile (the job's end raced the pass): it drains
            self.release(r, why)

    def lose(self, r: InstanceRecord, worker_id: str | None, reason: str, why: str) -> None:
        if worker_id is not None:
            self.service.end_worker_attempts(worker_id, reason, why)
        self.service.log_system(r.job_id, 0, [f"instance {r.request_id}: {why}"])
        self.release(r, why)

    def remember_reclaim(self, r: InstanceRecord, now: float) -> None:
        """The provider took the machine back: its offer is held for a while, and the record
        says why its try ended."""
        hold = float(self.settings.get("hold_reclaimed_seconds", HOLD_RECLAIMED_SECONDS))
        self.store.update_instance(
            r.request_id,
            note=RECLAIMED,
            outcome="reclaimed",
            outcome_scope=None,
            outcome_message=RECLAIMED,
            hold_until=now + hold,
        )
        r.note, r.outcome, r.hold_until = RECLAIMED, "reclaimed", now + hold

    def gone(self, r: InstanceRecord) -> None:
        """Nothing is left in the cloud: forget the link and remove the instance's keys."""
        from gpulayer.ssh.keys import KeyPair, remove_keypair

        self.links.close(r.request_id)
        self.store.release_reservation(r.request_id)
        # A gang's nodes share one key, and stay warm apart from their gang once taken: the
        # key goes with the last live machine that holds it.
        shared = r.key_path is not None and any(
            i.key_path == r.key_path and i.request_id != r.request_id
            for i in self.store.list_instances(live_only=True)
        )
        if r.key_path and not shared:
            private = Path(r.key_path)
            remove_keypair(KeyPair(private, private.with_suffix(".pub"), ""))
        pinned = host_keys_path(self.keys_dir, r.request_id)
        if pinned.is_dir():
            shutil.rmtree(pinned, ignore_errors=True)
        else:
            pinned.unlink(missing_ok=True)

    def end_nodes(
        self, gang: Sequence[InstanceRecord], to: str, reason: str, end: planning.TryEnd, now: float
    ) -> None:
        """A launch did not give the gang: every node moves to ``to``. Node 0's record alone
        carries the outcome, so one gang counts as one try when the next offer is chosen."""
        for node in gang:
            values: dict[str, Any] = end.columns() if node.node_rank == 0 else {}
            if to == "never_launched":
                values["ended_at"] = now
            # A node the stuck pass moved on meanwhile is its teardown's now.
            if self.move(node, to, reason, **values) and to == "never_launched":
                self.gone(node)

    def abandon_worker(self, request_id: str, *, stop: bool = True) -> None:
        """Stop the worker over its link (when it answers) and close the link."""
        from gpulayer.cloud.bootstrap import remove_command, stop_command

        link = self.links.pop(request_id)
        if link is None:
            return
        if stop and link.alive and link.install_dir:
            for command in (stop_command(link.install_dir, 10), remove_command(link.install_dir)):
                try:
                    link.session.run(command, timeout=60)
                except Exception as exc:
                    log.warning("instance %s: %s", request_id, exc)
                    break
        link.close()

    # --- the decision's actions -----------------------------------------------------------------

    def carry_out(
        self,
        r: InstanceRecord,
        worker_id: str | None,
        actions: Sequence[Action],
        now: float,
        start: Callable[[InstanceRecord, Step, float], None],
    ) -> None:
        """Each action in turn (``start`` begins a step); a move another controller won ends
        the list."""
        for action in actions:
            if isinstance(action, Move):
                if not self._carry_out_move(r, action, now):
                    return
            elif isinstance(action, Submit):
                start(r, action.step, now)
            elif isinstance(action, Release):
                self.release(r, action.why)
            elif isinstance(action, Rest):
                self.rest(r, action.why)
            elif isinstance(action, LoseWorker):
                self.lose(r, worker_id, action.reason, action.why)
            elif isinstance(action, EndGangNode):
                if action.end_attempt and worker_id is not None:
                    self.service.end_worker_attempts(worker_id, "worker_lost", action.why)
                self.release(r, action.why)
            elif isinstance(action, MarkUnreachable):
                self.store.update_instance(r.request_id, unreachable_since=action.at)
            elif isinstance(action, MarkReachable):
                self.store.update_instance(r.request_id, unreachable_since=None)
            elif isinstance(action, RememberReclaim):
                self.remember_reclaim(r, now)
            elif isinstance(action, HandOver):
                self.service.hand_to_reserved_worker(r.job_id)

    def _carry_out_move(self, r: InstanceRecord, move: Move, now: float) -> bool:
        values: dict[str, Any] = {}
        if move.failed_try:
            values.update(planning.failed(move.reason).columns())
        if move.gone:
            values["ended_at"] = now
        if not self.move(r, move.to, move.reason, **values):
            return False
        if move.announce:
            log.warning("instance %s: %s", r.request_id, move.reason)
            self.note(r.job_id, f"instance {r.request_id}: {move.reason}; moved to {move.to}")
        if move.gone:
            self.gone(r)
        return True
