"""Cloud jobs: rent the cheapest machine that fits, bootstrap a worker on it, run, tear down.

Runs inside the control plane (the embedded one or the team server), so a job's instance, its
SSH tunnel and its teardown outlive the CLI that submitted it. Everything rented is written to
the store before the call that creates it, and torn down on every path out; the reaper ends
whatever a crashed controller left behind.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpulayer.control.ids import new_id
from gpulayer.control.service import ControlService
from gpulayer.control.store import InstanceRecord
from gpulayer.errors import GpulayerError, UsageError
from gpulayer.spec import JobSpec

log = logging.getLogger("gpulayer.provisioner")

DEFAULT_DEADMAN_SECONDS = 600.0
INSTALL_ROOT = "/var/tmp/gpulayer"


class ProvisionFailed(GpulayerError):
    """This offer could not be turned into a ready worker; the next one may."""


class JobEnded(Exception):
    """The job was cancelled (or ended) while its machine was being prepared."""


ProvidersLoader = Callable[[tuple[str, ...]], Mapping[str, Any]]


class Provisioner:
    def __init__(
        self,
        service: ControlService,
        *,
        control_port: int,
        owner: str,
        load_providers: ProvidersLoader,
        settings: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        self.service = service
        self.store = service.store
        self.control_port = control_port
        self.owner = owner
        self.load_providers = load_providers
        self._settings = settings or dict
        self.keys_dir = service.layout.root / "keys"
        self._active: set[str] = set()
        self._lock = threading.Lock()
        self._reap_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        service.on_work(self._wake.set)

    @property
    def settings(self) -> Mapping[str, Any]:
        """Read at each use, so an edited providers.yaml applies to the next job."""
        return self._settings()

    # --- the loop that picks cloud jobs up ----------------------------------------------------

    def start(self) -> None:
        self.abandon_orphans()
        threading.Thread(target=self._loop, name="gpulayer-provisioner", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            try:
                self._take_new_jobs()
            except Exception:
                log.exception("provisioner pass failed")

    def _take_new_jobs(self) -> None:
        for job in self.store.queued_jobs():
            if job.target != "cloud" or job.spec["placement"].get("worker_ids"):
                continue  # pinned cloud jobs wait for their own worker, not a new machine
            if not self.store.update_job(job.id, expect_states=["queued"], state="provisioning"):
                continue
            with self._lock:
                self._active.add(job.id)
            threading.Thread(
                target=self._run_job,
                args=(job.id,),
                name=f"gpulayer-provision-{job.id}",
                daemon=True,
            ).start()

    def active_jobs(self) -> set[str]:
        with self._lock:
            return set(self._active)

    # --- one job ------------------------------------------------------------------------------

    def _run_job(self, job_id: str) -> None:
        try:
            self._provision(job_id)
        except JobEnded:
            pass
        except Exception as exc:
            log.exception("provisioning job %s failed", job_id)
            self._fail(job_id, "provision_failed", f"{type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                self._active.discard(job_id)

    def _note(self, job_id: str, text: str) -> None:
        self.service.log_system(job_id, 0, [text])

    def _provision(self, job_id: str) -> None:
        from gpulayer.cloud.errors import ProviderError, ScopedProviderError
        from gpulayer.cloud.offer import OfferQuery
        from gpulayer.cloud.ranking import BlockList
        from gpulayer.cloud.search import gather, select, why_nothing_fits

        job = self.store.get_job(job_id)
        spec = JobSpec.model_validate(job.spec)
        placement = spec.placement
        providers = self.load_providers(tuple(placement.providers))
        if not providers:
            return self._next_target_or_fail(
                job_id, spec, "no cloud provider is installed or enabled"
            )
        query = OfferQuery.from_spec(spec)
        ranked = gather(providers, query, note=lambda text: self._note(job_id, text)).ranked
        blocked = BlockList()

        def fitting() -> Any:
            return select(ranked, query, placement, blocked=blocked)

        first = fitting()
        if not first.offers:
            why = why_nothing_fits(ranked, query, placement, first)
            return self._next_target_or_fail(job_id, spec, why)
        tried: set[tuple[str, str, str | None, str]] = set()
        failures: list[str] = []
        config_errors: dict[str, int] = {}
        while True:
            self._ensure_live(job_id)
            candidates = fitting().offers
            offer = next(
                (
                    o
                    for o in candidates
                    if (o.provider, o.region, o.zone, o.instance_type) not in tried
                ),
                None,
            )
            if offer is None:
                break
            tried.add((offer.provider, offer.region, offer.zone, offer.instance_type))
            try:
                self._run_on(job_id, spec, offer, providers[offer.provider])
                return
            except ScopedProviderError as exc:
                blocked.record(exc)
                failures.append(str(exc))
                self._note(job_id, f"{offer.label}: {exc}; blocking that {exc.scope} and moving on")
            except UsageError as exc:  # ProviderSettingsError, an image release missing, ...
                # A configuration error repeats on every offer of that provider: one more try
                # (it may be one region's, such as an image missing there), then none.
                failures.append(str(exc))
                config_errors[offer.provider] = config_errors.get(offer.provider, 0) + 1
                if config_errors[offer.provider] >= 2:
                    blocked.block("provider", offer.provider, kind="configuration error")
                    self._note(job_id, f"{offer.label}: {exc}; not trying {offer.provider} again")
                else:
                    self._note(job_id, f"{offer.label}: {exc}; trying the next offer")
            except (ProviderError, ProvisionFailed, GpulayerError) as exc:
                # SSH, bootstrap (e.g. a host without a usable python) or launch failed here.
                failures.append(str(exc))
                self._note(job_id, f"{offer.label}: {exc}; trying the next offer")
        return self._next_target_or_fail(
            job_id, spec, "every offer failed: " + "; ".join(failures[-5:])
        )

    def _run_on(self, job_id: str, spec: JobSpec, offer: Any, provider: Any) -> None:
        """One try: record, launch, reach, bootstrap, run the job, and always tear down."""
        from gpulayer.cloud.protocol import LaunchRequest
        from gpulayer.ssh.keys import generate_keypair

        request_id = new_id("r", 12)
        keys = generate_keypair(self.keys_dir, request_id)
        tags = {
            "gpulayer:owner": self.owner,
            "gpulayer:job": job_id,
            "gpulayer:request": request_id,
        }
        self.store.record_instance(
            request_id=request_id,
            job_id=job_id,
            owner=self.owner,
            provider=offer.provider,
            region=offer.region,
            zone=offer.zone,
            instance_type=offer.instance_type,
            state="recorded",
            key_path=str(keys.private_path),
            hourly_price=offer.hourly_price,
            currency=offer.currency,
            spot=offer.spot,
            tags=tags,
        )
        timeout = (
            spec.placement.provisioning.provisioning_timeout_seconds
            if spec.placement.provisioning
            else 600
        )
        deadline = time.monotonic() + timeout
        release = spec.placement.provisioning.release if spec.placement.provisioning else None
        remote = None
        token_hash: str | None = None
        try:
            image = self._image_for(offer.provider, release)
            self._note(job_id, f"launching {offer.label} at {_price(offer)}")
            request = LaunchRequest(
                request_id=request_id,
                job_id=job_id,
                owner=self.owner,
                tags=tags,
                ssh_public_key=keys.public_key,
                allowed_ssh_cidr=self._ssh_cidr(),
                image_release=release,
                image=image,
                disk_gb=int(spec.resources.disk_gb) if spec.resources.disk_gb else None,
                spot=offer.spot,
                progress=lambda text: self._note(job_id, text),
            )
            self.store.update_instance(request_id, state="launching")
            instance = provider.launch(offer, request)
            self.store.update_instance(
                request_id,
                state="running",
                instance_id=instance.id,
                ssh_host=instance.ssh_host,
                launched_at=time.time(),
                hourly_price=instance.hourly_price
                if instance.hourly_price is not None
                else offer.hourly_price,
            )
            self.service.store.update_job(job_id, message=f"provisioning {offer.label}")
            self._ensure_live(job_id)
            remote, token_hash = self._bootstrap(
                job_id, spec, offer, instance, keys.private_path, deadline
            )
            worker_id = self._wait_for_worker(job_id, request_id, deadline)
            self.store.update_instance(request_id, ready_at=time.time())
            self._note(job_id, f"worker {request_id} is ready on {instance.ssh_host}")
            self._hand_job_to(job_id, worker_id)
            self._wait_until_ended(job_id)
        except JobEnded:
            raise
        except GpulayerError:
            raise
        except Exception as exc:  # SSH, bootstrap and unexpected failures: this offer failed
            raise ProvisionFailed(f"{type(exc).__name__}: {exc}") from exc
        finally:
            self._teardown(job_id, request_id, provider, remote, token_hash, keys)

    def _ssh_cidr(self) -> str:
        configured = self.settings.get("ssh_cidr")
        if configured:
            return str(configured)
        from gpulayer.cloud.network import controller_cidr

        return controller_cidr()

    def _image_for(self, provider: str, release: str | None) -> dict[str, Any]:
        try:
            from gpulayer.cloud.images import resolve_release
        except ImportError:
            return {}
        return dict(resolve_release(provider, release).selector)

    def _bootstrap(
        self, job_id: str, spec: JobSpec, offer: Any, instance: Any, key_path: Path, deadline: float
    ) -> tuple[Any, str]:
        from gpulayer.cloud.bootstrap import BootstrapPlan, bootstrap_worker
        from gpulayer.cloud.wheelhouse import build_wheelhouse
        from gpulayer.control.tokens import hash_token
        from gpulayer.ssh.hostkeys import JsonHostKeyStore
        from gpulayer.ssh.target import SshTarget
        from gpulayer.ssh.wait import wait_for_ssh

        target = SshTarget(
            instance.ssh_host,
            instance.ssh_port,
            instance.ssh_user,
            key_path=key_path,
            host_key=instance.host_key,
        )
        request_id = instance.tags.get("gpulayer:request") or ""
        self._note(job_id, f"waiting for SSH on {target}")
        # Host keys are pinned for this instance's life; its address may later be another's.
        host_keys = JsonHostKeyStore(self.keys_dir / f"{request_id}.hosts")
        session = wait_for_ssh(
            target,
            _remaining(deadline),
            host_keys=host_keys,
            on_progress=lambda text: self._note(job_id, text),
        )
        token = self.service.create_token("worker", f"cloud worker {request_id}")
        install_root = instance.tags.get("gpulayer:install-root", INSTALL_ROOT)
        plan = BootstrapPlan(
            install_dir=f"{install_root}/{job_id}",
            control_plane_port=self.control_port,
            worker_token=token,
            worker_name=request_id,
            labels={"gpulayer.request": request_id, "gpulayer.job": job_id},
            provider=offer.provider,
            region=offer.region,
            zone=offer.zone,
            hourly_price=offer.hourly_price,
            currency=offer.currency,
            deadman_seconds=float(self.settings.get("deadman_seconds", DEFAULT_DEADMAN_SECONDS)),
            deadman_action=self._deadman_action(offer.provider),
            python=instance.tags.get("gpulayer:python", "python3"),
        )
        self._note(job_id, "bootstrapping the worker")
        wheelhouse = build_wheelhouse(self.service.layout.root / "cache" / "wheelhouse")
        remote = bootstrap_worker(
            session,
            plan,
            wheelhouse,
            on_output=lambda line: self._note(job_id, line),
            timeout=_remaining(deadline),
        )
        return remote, hash_token(token)

    def _deadman_action(self, provider: str) -> str:
        configured = os.environ.get("GPULAYER_DEADMAN_ACTION") or self.settings.get(
            "deadman_action"
        )
        if configured:
            return str(configured)
        # Powering off is how a cloud instance stops billing; on a host we do not own, only
        # the worker stops.
        return "stop" if provider == "ssh" else "poweroff"

    def _wait_for_worker(self, job_id: str, request_id: str, deadline: float) -> str:
        while time.monotonic() < deadline:
            self._ensure_live(job_id)
            for worker in self.store.list_workers():
                if worker.name == request_id and worker.state == "ready":
                    return worker.id
            self.service.wait_for_change(self.service.version, 0.5)
        raise ProvisionFailed("the worker did not join the control plane in time")

    def _hand_job_to(self, job_id: str, worker_id: str) -> None:
        job = self.store.get_job(job_id)
        spec = dict(job.spec)
        spec["placement"] = {**spec["placement"], "worker_ids": [worker_id]}
        if not self.store.update_job(
            job_id, expect_states=["provisioning"], spec=spec, state="queued"
        ):
            raise JobEnded()
        self.service.dispatch()

    def _wait_until_ended(self, job_id: str) -> None:
        while True:
            job = self.store.get_job(job_id)
            if job.terminal:
                return
            self.service.wait_for_change(self.service.version, 1.0)

    def _ensure_live(self, job_id: str) -> None:
        if self.store.get_job(job_id).state not in ("provisioning", "queued", "running"):
            raise JobEnded()

    def _teardown(
        self,
        job_id: str,
        request_id: str,
        provider: Any,
        remote: Any,
        token_hash: str | None,
        keys: Any,
    ) -> None:
        from gpulayer.ssh.keys import remove_keypair

        if remote is not None:
            for step in (remote.stop, remote.cleanup, remote.close):
                try:
                    step()
                except Exception as exc:
                    log.warning("worker teardown on %s: %s", request_id, exc)
        for worker in self.store.list_workers():
            if worker.name == request_id and worker.state != "gone":
                self.store.set_worker_state(worker.id, "gone")  # its machine is being handed back
        ended = self._terminate(self.store.get_instance(request_id), provider)
        if token_hash is not None:
            self.store.remove_token(token_hash)
        remove_keypair(keys)
        shutil.rmtree(self.keys_dir / f"{request_id}.hosts", ignore_errors=True)
        if ended:
            self._note(job_id, f"instance {request_id} torn down")
        else:
            self._note(job_id, f"instance {request_id}: terminating failed; the reaper will retry")

    def _terminate(self, record: InstanceRecord, provider: Any) -> bool:
        if record.gone:
            return True
        if record.instance_id is None and record.state == "recorded":
            self.store.update_instance(
                record.request_id, state="never_launched", ended_at=time.time()
            )
            return True
        self.store.update_instance(record.request_id, state="terminating")
        ids = [record.instance_id] if record.instance_id else []
        error: Exception | None = None
        for delay in (0.0, 1.0, 3.0):  # an SSH hiccup right after the job must not leave a bill
            time.sleep(delay)
            try:
                if not record.instance_id:
                    # Launch may have gone through without an answer: find it by its request
                    # tag. Inside the retries, so a failing lookup is retried and recorded too.
                    owned = provider.list_owned({"gpulayer:request": record.request_id})
                    ids = [i.id for i in owned]
                if ids:
                    provider.terminate(ids)
                    still = [i for i in provider.describe(ids) if i.state != "terminated"]
                    if still:
                        raise ProvisionFailed(
                            f"{', '.join(i.id for i in still)} not terminated yet"
                        )
                error = None
                break
            except Exception as exc:
                error = exc
        if error is not None:
            log.warning(
                "terminating %s failed (%s); the reaper will retry", record.request_id, error
            )
            self.store.update_instance(record.request_id, note=f"terminate failed: {error}")
            return False
        self.store.update_instance(record.request_id, state="terminated", ended_at=time.time())
        return True

    def _next_target_or_fail(self, job_id: str, spec: JobSpec, why: str) -> None:
        chain = spec.placement.targets
        position = chain.index("cloud") if "cloud" in chain else len(chain) - 1
        refused: list[str] = []
        for target in chain[position + 1 :]:
            from gpulayer.control.targets import choose_target

            remaining = spec.model_copy(deep=True)
            remaining.placement.target = target  # type: ignore[assignment]
            remaining.placement.fallback_targets = [t for t in chain[chain.index(target) + 1 :]]  # type: ignore[misc]
            decision = choose_target(remaining, self.service.worker_views())
            if decision.target:
                self._note(job_id, f"cloud: {why}; trying target {decision.target}")
                self.store.update_job(
                    job_id, expect_states=["provisioning"], state="queued", target=decision.target
                )
                self.service.dispatch()
                return
            # The first decision walked the whole rest of the chain: its notes say, per
            # fallback target, why that one cannot run the job either.
            refused = refused or decision.notes
        if refused:
            why = f"{why}; fallback: {'; '.join(refused)}"
        self._fail(job_id, "unschedulable", why)

    def _fail(self, job_id: str, reason: str, message: str) -> None:
        self._note(job_id, f"{reason}: {message}")
        self.store.update_job(
            job_id,
            expect_states=["provisioning", "queued"],
            state="failed",
            reason=reason,
            message=message,
            finished_at=time.time(),
        )
        self.service.notify()

    # --- crash recovery -----------------------------------------------------------------------

    def abandon_orphans(self) -> None:
        """Cloud jobs a previous controller was provisioning or running have lost their machine."""
        for job in self.store.list_jobs(states=["provisioning"], limit=10_000):
            self._fail(job.id, "worker_lost", "the controller stopped while provisioning")
        for job in self.store.list_jobs(states=["running", "queued"], limit=10_000):
            pinned = job.target == "cloud" and job.spec["placement"].get("worker_ids")
            if pinned and self.store.list_instances(job_id=job.id, live_only=True):
                self.store.update_job(
                    job.id,
                    expect_states=["running", "queued"],
                    state="failed",
                    reason="worker_lost",
                    message="the controller stopped while the job ran",
                    finished_at=time.time(),
                )

    def reap(self, *, dry_run: bool = False) -> list[dict[str, Any]]:
        """End owned instances that have no live job. Returns what was (or would be) ended."""
        with self._reap_lock:
            return self._reap(dry_run=dry_run)

    def _reap(self, *, dry_run: bool) -> list[dict[str, Any]]:
        live = self.active_jobs()
        ended: list[dict[str, Any]] = []
        providers: Mapping[str, Any] = {}
        try:
            providers = self.load_providers(())
        except GpulayerError as exc:
            log.warning("reaper: %s", exc)
        known: set[str] = set()
        for record in self.store.list_instances(live_only=True):
            if record.instance_id:
                known.add(record.instance_id)
            if record.job_id in live:
                continue
            entry = {
                "request_id": record.request_id,
                "provider": record.provider,
                "instance_id": record.instance_id,
                "job_id": record.job_id,
            }
            ended.append(entry)
            if not dry_run and record.provider in providers:
                self._terminate(record, providers[record.provider])
        for name, provider in providers.items():
            try:
                owned = provider.list_owned({"gpulayer:owner": self.owner})
            except Exception as exc:
                log.warning("reaper: listing %s failed: %s", name, exc)
                continue
            for instance in owned:
                job_id = instance.tags.get("gpulayer:job")
                if instance.id in known or job_id in live:
                    continue
                ended.append(
                    {
                        "request_id": instance.tags.get("gpulayer:request"),
                        "provider": name,
                        "instance_id": instance.id,
                        "job_id": job_id,
                    }
                )
                if not dry_run:
                    try:
                        provider.terminate([instance.id])
                    except Exception as exc:
                        log.warning("reaper: terminating %s failed: %s", instance.id, exc)
        return ended


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise ProvisionFailed("provisioning_timeout_seconds ran out")
    return left


def _price(offer: Any) -> str:
    return (
        "an unknown price"
        if offer.hourly_price is None
        else f"{offer.hourly_price} {offer.currency}/h"
    )


def owner_id(root: Path) -> str:
    """This controller's identity in instance tags, stable across restarts."""
    path = root / "owner-id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    owner = new_id("o", 12)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(owner + "\n")
    try:
        os.link(tmp, path)
    except FileExistsError:
        owner = path.read_text().strip()
    tmp.unlink(missing_ok=True)
    return owner


REAP_EVERY_SECONDS = 60.0


def attach_provisioner(service: ControlService, control_port: int) -> Provisioner:
    """Give a control plane its cloud side: providers from providers.yaml, a reaper pass now and
    every minute."""
    from gpulayer.cloud.config import check_config, enabled_providers, orchestrator_settings

    root = service.layout.root
    provisioner = Provisioner(
        service,
        control_port=control_port,
        owner=owner_id(root),
        load_providers=lambda only: enabled_providers(root, only),
        settings=lambda: orchestrator_settings(root),
    )
    service.cloud_available = lambda: bool(check_config(root).providers)
    service.provisioner = provisioner
    provisioner.start()

    def reaper() -> None:
        while not provisioner._stop.is_set():
            try:
                ended = provisioner.reap()
                if ended:
                    log.info("reaper ended %d orphaned instance(s)", len(ended))
            except Exception:
                log.exception("reaper pass failed")
            provisioner._stop.wait(REAP_EVERY_SECONDS)

    threading.Thread(target=reaper, name="gpulayer-reaper", daemon=True).start()
    return provisioner
