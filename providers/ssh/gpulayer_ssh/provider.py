"""The ssh provider: gpulayer's five provider verbs on machines the user already has.

"Launching" a host claims it for one request and lets the request's per-instance key log in
(a gang claims the offer's host and N - 1 alike free hosts of its region at once, or none);
"terminating" it ends that job's worker, removes that job's install dir and the key, and frees
the claim. Nothing is ever powered off, and nothing outside the job's install dir and the key
line is changed on the host.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import TYPE_CHECKING, Any

from gpulayer.cloud import (
    CapacityError,
    DiskCache,
    GangProvider,
    Instance,
    JobKeyFile,
    JobKeyLogin,
    LaunchRequest,
    Offer,
    OfferQuery,
    OffersAreMachines,
    ProviderError,
    add_authorized_key_command,
    load_settings,
    node_install_dir,
    remove_authorized_key_command,
    remove_command,
    stop_command,
)
from gpulayer_ssh import hardware
from gpulayer_ssh.claims import Claim, ClaimStore
from gpulayer_ssh.errors import PROVIDER, HostUnreachable
from gpulayer_ssh.settings import HostHardware, SshHost, SshProviderSettings

if TYPE_CHECKING:
    from gpulayer.cloud import SshSession

log = logging.getLogger("gpulayer.providers.ssh")

INSTALL_ROOT_TAG = "gpulayer:install-root"
PYTHON_TAG = "gpulayer:python"
NODE_RANK_TAG = "gpulayer:node-rank"
_JOB_DIR = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_PROBE_WORKERS = 16
_STOP_GRACE_SECONDS = 10.0


class SshHostsProvider(GangProvider, OffersAreMachines):
    """Existing hosts over SSH. Settings: see :class:`gpulayer_ssh.settings.SshProviderSettings`.

    Each offer is one configured host: the orchestrator gives it to one job at a time."""

    settings_model = SshProviderSettings
    """What providers.yaml's section for this provider is validated into."""

    name = PROVIDER

    def __init__(self, settings: SshProviderSettings | Mapping[str, Any] | None = None) -> None:
        self.settings = load_settings(SshProviderSettings, settings, provider=PROVIDER)
        state = self.settings.resolved_state_dir()
        self.claims = ClaimStore(state / "claims")
        self._probes = DiskCache(state / "probes")
        self._host_keys_dir = state / "host-keys"
        self._lock = threading.Lock()

    # --- the five verbs -----------------------------------------------------------------------

    def offers(self, query: OfferQuery) -> list[Offer]:
        """One offer per host that is free and answers (or is described by hand); hosts that
        cannot be reached are left out and logged, and when none of the free hosts answers the
        ProviderError says why for each."""
        claimed = {c.host for c in self.claims.all()}
        free = [h for h in self.settings.hosts if h.name not in claimed]
        for host in self.settings.hosts:
            if host.name in claimed:
                log.info("ssh host %s is claimed by a job; not offered", host.name)
        if not free:
            return []
        with ThreadPoolExecutor(max_workers=min(_PROBE_WORKERS, len(free))) as pool:
            found = list(pool.map(self._hardware_or_reason, free))
        offers = [
            hardware.offer_for(host, probed)
            for host, probed in zip(free, found, strict=True)
            if not isinstance(probed, str)
        ]
        if not offers:
            # No free host answered: say why, or a listing shows no ssh row and no reason.
            reasons = "; ".join(str(probed) for probed in found)
            raise ProviderError(f"no host answers: {reasons}", provider=PROVIDER)
        return offers

    def launch(self, offer: Offer, request: LaunchRequest) -> Instance:
        if request.count != 1:
            raise ProviderError(
                "launch claims one host; a gang goes to launch_gang", provider=PROVIDER
            )
        return self._claim_hosts([self._launchable(offer, request)], request)[0]

    def launch_gang(self, offer: Offer, request: LaunchRequest) -> list[Instance]:
        """The offer's host and ``count - 1`` free hosts of its region alike to it (same
        hardware and price), claimed together or not at all. The nodes reach each other by
        the hosts' addresses."""
        lead = self._launchable(offer, request)
        if request.count == 1:
            return self._claim_hosts([lead], request)
        claimed = {c.host for c in self.claims.all() if c.request_id != request.request_id}
        peers = [
            h
            for h in self.settings.hosts
            if h.name != lead.name and h.region == lead.region and h.name not in claimed
        ]
        alike = [h for h in peers if _alike(offer, self._hardware_or_reason(h), h)]
        if len(alike) < request.count - 1:
            raise CapacityError(
                "region",
                PROVIDER,
                lead.region,
                None,
                f"a gang of {request.count} needs {request.count} free hosts like {lead.name} "
                f"in region {lead.region}; {len(alike) + 1} are",
            )
        return self._claim_hosts([lead, *alike[: request.count - 1]], request)

    def _launchable(self, offer: Offer, request: LaunchRequest) -> SshHost:
        if offer.provider != PROVIDER:
            raise ProviderError(f"offer {offer.label} is not an ssh host", provider=PROVIDER)
        host = self._configured(offer.instance_type)
        if not _JOB_DIR.match(request.job_id) or request.job_id in (".", ".."):
            raise ProviderError(
                f"job id {request.job_id!r} cannot name a directory below {host.install_root}",
                provider=PROVIDER,
            )
        return host

    def _claim_hosts(self, hosts: list[SshHost], request: LaunchRequest) -> list[Instance]:
        """Claim every host for the request (node rank = position) and authorize its key
        there; when one cannot be had, the claims made here are freed and nothing is left."""
        try:
            command = {
                h.name: add_authorized_key_command(
                    h.authorized_keys, request.ssh_public_key, request.request_id
                )
                for h in hosts
            }
        except ValueError as exc:
            raise ProviderError(f"ssh_public_key: {exc}", provider=PROVIDER) from None
        fresh: list[SshHost] = []
        held_claims: list[Claim] = []
        try:
            for rank, host in enumerate(hosts):
                wanted = self._claim_for(host, request, rank if len(hosts) > 1 else None)
                held = self.claims.create(wanted)
                if held.request_id != request.request_id:
                    raise CapacityError(
                        "zone",
                        PROVIDER,
                        host.region,
                        host.name,
                        f"host {host.name} is in use by request {held.request_id} "
                        f"(job {held.job_id})",
                    )
                if held is wanted:
                    fresh.append(host)
                held_claims.append(held)
            for host in hosts:
                with self._session(
                    host, wait=self.settings.launch_wait_seconds, progress=request.progress
                ) as session:
                    _checked(
                        session,
                        command[host.name],
                        f"cannot authorize the request's key on {host.name}",
                    )
        except BaseException:
            for host in fresh:
                self.claims.release(host.name, request.request_id)
            raise
        return [c.instance for c in held_claims]

    def describe(self, ids: Sequence[str]) -> list[Instance]:
        found = []
        for host in dict.fromkeys(ids):
            claim = self.claims.read(host) if _JOB_DIR.match(host) else None
            if claim is not None:
                found.append(claim.instance)
        return found

    def terminate(self, ids: Sequence[str]) -> None:
        """End each claimed host's job: stop its worker, remove its install dir and the
        request's key, free the claim. Unclaimed ids are already done. A host that cannot be
        reached keeps its claim (so a later terminate or the reaper tries again) and the
        call raises once every other id was handled."""
        failures = []
        for host in dict.fromkeys(ids):
            claim = self.claims.read(host) if _JOB_DIR.match(host) else None
            if claim is None:
                continue
            try:
                self._clean(claim)
            except ProviderError as exc:
                failures.append(str(exc))
                continue
            self.claims.release(claim.host, claim.request_id)
        if failures:
            raise ProviderError("; ".join(failures), provider=PROVIDER)

    def list_owned(self, tags: Mapping[str, str]) -> list[Instance]:
        if not tags:
            # Without a tag every claim would match, and a reaper would end them all.
            raise ProviderError("list_owned needs at least one tag to match", provider=PROVIDER)
        return [
            claim.instance
            for claim in self.claims.all()
            if all(claim.tags.get(k) == v for k, v in tags.items())
        ]

    # --- for the orchestrator -----------------------------------------------------------------

    def job_key_logins(self) -> list[JobKeyLogin]:
        """Each host, as logged into to probe it, with the file a launch writes the job key
        to there (`gpulayer config check` tries a key written there)."""
        from gpulayer.cloud import SshTarget

        return [
            JobKeyLogin(
                f"{PROVIDER} {h.name}",
                SshTarget(h.address, h.port, h.user, key_path=h.key_path, host_key=h.host_key),
                _job_key_file(h),
                self._host_keys_dir,
            )
            for h in self.settings.hosts
        ]

    def host(self, name: str) -> SshHost:
        """The settings of a configured host (its python, install root and labels)."""
        return self._configured(name)

    def install_dir(self, instance_id: str, job_id: str) -> str:
        """Where a job on that host installs its worker; terminate removes exactly this."""
        claim = self.claims.read(instance_id)
        root = (
            claim.connection["install_root"]
            if claim is not None
            else self._configured(instance_id).install_root
        )
        return f"{root}/{job_id}"

    def probe(self, name: str, *, refresh: bool = False) -> HostHardware:
        """A host's hardware, probed over SSH (or as described by hand), cached for the TTL."""
        host = self._configured(name)
        if host.hardware is not None:
            return host.hardware
        key = f"{host.name}-{host.user}@{host.address}:{host.port}"
        ttl = 0 if refresh else self.settings.probe_ttl_seconds
        cached = self._probes.get(key, ttl) if ttl > 0 else None
        if cached is not None:
            return HostHardware.model_validate(cached)
        found = self._probe(host)
        self._probes.put(key, found.model_dump(mode="json"))
        return found

    # --- helpers -------------------------------------------------------------------------------

    def _configured(self, name: str) -> SshHost:
        host = self.settings.host(name)
        if host is None:
            known = ", ".join(h.name for h in self.settings.hosts)
            raise ProviderError(f"no host named {name!r} (hosts: {known})", provider=PROVIDER)
        return host

    def _hardware_or_reason(self, host: SshHost) -> HostHardware | str:
        """The host's hardware, or why it offers nothing."""
        try:
            return self.probe(host.name)
        except HostUnreachable as exc:
            log.warning("ssh host %s offers nothing: %s", host.name, exc.message)
            return f"{host.name}: {exc.message}"

    def _probe(self, host: SshHost) -> HostHardware:
        with self._session(host) as session:
            result = session.run(
                hardware.probe_command(host.install_root),
                timeout=self.settings.probe_timeout_seconds,
            )
        try:
            return hardware.parse_probe(result.stdout)
        except ValueError as exc:
            raise HostUnreachable(
                host.name, host.region, f"cannot read the hardware of {host.name}: {exc}"
            ) from exc

    def _session(
        self,
        host: SshHost | Mapping[str, Any],
        *,
        wait: float = 0,
        progress: Callable[[str], None] | None = None,
    ) -> _HostSession:
        return _HostSession(self, host, wait=wait, progress=progress)

    def _claim_for(self, host: SshHost, request: LaunchRequest, node_rank: int | None) -> Claim:
        tags = {**request.tags, INSTALL_ROOT_TAG: host.install_root, PYTHON_TAG: host.python}
        if node_rank is not None:
            tags[NODE_RANK_TAG] = str(node_rank)
        instance = Instance(
            id=host.name,
            provider=PROVIDER,
            region=host.region,
            zone=host.name,
            state="running",
            instance_type=host.name,
            ssh_host=host.address,
            ssh_user=host.user,
            ssh_port=host.port,
            host_key=host.host_key,
            hourly_price=host.hourly_price,
            currency=host.currency,
            spot=False,
            tags=tags,
            launched_at=dt.datetime.now(dt.timezone.utc),
            install_root=host.install_root,
            python=host.python,
            job_key_file=_job_key_file(host),
        )
        return Claim(
            host=host.name,
            request_id=request.request_id,
            job_id=request.job_id,
            owner=request.owner,
            tags=tags,
            instance=instance,
            connection={
                "address": host.address,
                "port": host.port,
                "user": host.user,
                "key_path": str(host.key_path),
                "host_key": host.host_key,
                "install_root": host.install_root,
                "install_dir": node_install_dir(host.install_root, request.job_id, node_rank or 0),
                "authorized_keys": host.authorized_keys,
                "region": host.region,
            },
        )

    def _clean(self, claim: Claim) -> None:
        conn = claim.connection
        install_dir = conn.get("install_dir") or f"{conn['install_root']}/{claim.job_id}"
        with self._session(conn | {"name": claim.host}) as session:
            _checked(
                session,
                stop_command(install_dir, _STOP_GRACE_SECONDS),
                f"cannot stop the worker of job {claim.job_id} on {claim.host}",
            )
            _checked(
                session,
                remove_command(install_dir),
                f"cannot remove {install_dir} on {claim.host}",
            )
            _checked(
                session,
                remove_authorized_key_command(str(conn["authorized_keys"]), claim.request_id),
                f"cannot remove the key of request {claim.request_id} on {claim.host}",
            )


def _job_key_file(host: SshHost) -> JobKeyFile:
    return JobKeyFile(
        path=host.authorized_keys, setting=f"{PROVIDER}.hosts[{host.name}].authorized_keys"
    )


def _alike(offer: Offer, found: HostHardware | str, host: SshHost) -> bool:
    """Could the host be another node of a gang on ``offer``'s host: same accelerators, at
    least its cores, memory and disk, at the same price. ``found``: its hardware, or why it
    has none (unreachable)."""
    if isinstance(found, str):
        return False
    other = hardware.offer_for(host, found)
    same = ("accelerator", "gpu_name", "gpu_count", "gpu_memory_gb", "cpu_arch", "os", "currency")
    if any(getattr(other, name) != getattr(offer, name) for name in same):
        return False
    if other.hourly_price != offer.hourly_price:
        return False
    for name in ("cpu_cores", "memory_gb", "disk_gb"):
        wanted, has = getattr(offer, name), getattr(other, name)
        if wanted is not None and (has is None or has < wanted):
            return False
    return True


def _checked(session: SshSession, command: str, what: str, timeout: float = 120) -> None:
    result = session.run(command, timeout=timeout)
    if result.exit_code != 0:
        output = (result.stderr or result.stdout).strip().splitlines()
        raise ProviderError(
            f"{what} (exit {result.exit_code}): {' | '.join(output[-3:])}", provider=PROVIDER
        )


class _HostSession:
    """A connected session to a host for one step; SSH failures become provider errors."""

    def __init__(
        self,
        provider: SshHostsProvider,
        host: SshHost | Mapping[str, Any],
        *,
        wait: float = 0,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self._provider = provider
        self._wait = wait
        self._progress = progress
        if isinstance(host, SshHost):
            host = {
                "name": host.name,
                "address": host.address,
                "port": host.port,
                "user": host.user,
                "key_path": str(host.key_path),
                "host_key": host.host_key,
                "region": host.region,
            }
        self._host = dict(host)
        self._session: SshSession | None = None

    def __enter__(self) -> SshSession:
        from gpulayer.cloud import JsonHostKeyStore, SshError, SshSession, SshTarget

        h = self._host
        settings = self._provider.settings
        try:
            target = SshTarget(
                str(h["address"]),
                int(h["port"]),
                str(h["user"]),
                key_path=h["key_path"],
                host_key=h.get("host_key"),
            )
            host_keys = JsonHostKeyStore(self._provider._host_keys_dir)
            if self._wait > 0:
                from gpulayer.cloud import wait_for_ssh

                self._session = wait_for_ssh(
                    target,
                    self._wait,
                    host_keys=host_keys,
                    attempt_timeout=settings.connect_timeout_seconds,
                    retry_auth=False,
                    on_progress=self._progress,
                )
            else:
                session = SshSession(target, host_keys=host_keys)
                self._session = session.connect(timeout=settings.connect_timeout_seconds)
        except SshError as exc:
            raise HostUnreachable(str(h["name"]), str(h["region"]), str(exc)) from exc
        return self._session

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        from gpulayer.cloud import SshError, UsageError

        if self._session is not None:
            self._session.close()
        if isinstance(exc, SshError) and not isinstance(exc, UsageError):
            raise HostUnreachable(str(self._host["name"]), str(self._host["region"]), str(exc))
