"""The control plane: one service per aggregate, built here with the collaborators each needs.

One control plane serves the embedded local control plane and the team server alike; the HTTP
API and the in-process local worker are two doors into it. Each aggregate is a service of its
own (see docs/architecture.md): ``submissions`` and ``jobs`` (jobs and attempts), ``workers``,
``claims`` and ``reports`` (workers and what they claim and report), ``gangs``, ``tokens``,
``bundles``, and ``cloud_moves`` (what the cloud lifecycle does to jobs and workers). The
cloud side is a typed :class:`CloudGate` given at construction.
"""

from __future__ import annotations

from gpulayer.control.attempt_ends import AttemptEnds
from gpulayer.control.attempt_reports import AttemptReports
from gpulayer.control.bundle_store import BundleStore
from gpulayer.control.changes import ChangeFeed
from gpulayer.control.claim_service import ClaimService
from gpulayer.control.cloud_gate import CloudGate, NoCloud
from gpulayer.control.cloud_moves import CloudJobMoves
from gpulayer.control.dispatch import LivePlacement
from gpulayer.control.dispatcher import Dispatcher
from gpulayer.control.gang_service import GangService
from gpulayer.control.job_service import JobService
from gpulayer.control.job_states import JobStates
from gpulayer.control.output_keeping import OutputKeeper
from gpulayer.control.output_uploads import OutputLimits
from gpulayer.control.paths import HomeLayout
from gpulayer.control.progress import ServerProgress
from gpulayer.control.secret_vault import SecretVault
from gpulayer.control.serving_clock import ServingClock
from gpulayer.control.store import Store
from gpulayer.control.submissions import Submissions
from gpulayer.control.submit_environments import SubmitEnvironments
from gpulayer.control.token_service import TokenService
from gpulayer.control.worker_access import WorkerAccess
from gpulayer.control.worker_service import WorkerService


class ControlService:
    def __init__(
        self,
        store: Store,
        layout: HomeLayout,
        *,
        heartbeat_timeout: float = 30.0,
        cloud: CloudGate | None = None,
        default_target: str = "local",
        output_limits: OutputLimits | None = None,
        placement: LivePlacement | None = None,
    ) -> None:
        """``default_target``: the target of a job whose spec names none (a team server's is
        remote: it has no local worker). ``output_limits``: what one outputs upload of a
        remote worker may hold. ``placement``: the dispatch pass's live view of the workers
        (kept between passes; a benchmark gives one with its own settings)."""
        self.store = store
        self.layout = layout
        self.heartbeat_timeout = heartbeat_timeout
        self.cloud: CloudGate = cloud or NoCloud()
        self.default_target = default_target
        self.output_limits = output_limits or OutputLimits()
        self.progress = ServerProgress()
        """Beaten by the HTTP edge: stalls of this server never count against workers."""
        self.clock = ServingClock()
        self.bundles = BundleStore(layout.root)
        self.tokens = TokenService(store)
        self.changes = ChangeFeed(store)
        self.environments = SubmitEnvironments()
        self.secrets = SecretVault(store, layout.root / "secrets.key")
        self.placement = placement or LivePlacement(store)
        self.dispatcher = Dispatcher(store, self.placement, self.changes)
        self.states = JobStates(store, on_queue_change=self.dispatcher.queue_moved)
        self.gangs = GangService(store, self.states, self.changes)
        self.ends = AttemptEnds(store, self.states, self.placement, self.gangs, self.changes)
        self.access = WorkerAccess(store)
        self._build_worker_side()
        self._build_job_side()

    def _build_worker_side(self) -> None:
        """Workers, their claims, and what they report."""
        store = self.store
        self.workers = WorkerService(
            store,
            placement=self.placement,
            dispatcher=self.dispatcher,
            ends=self.ends,
            tokens=self.tokens,
            changes=self.changes,
            progress=self.progress,
            clock=self.clock,
            heartbeat_timeout=self.heartbeat_timeout,
            silence_excused=self.cloud.silence_excused,
        )
        self.claims = ClaimService(
            store,
            self.states,
            self.gangs,
            self.changes.news,
            self.layout,
            self.environments,
            self.secrets,
        )
        self.reports = AttemptReports(
            store,
            self.states,
            access=self.access,
            gangs=self.gangs,
            ends=self.ends,
            placement=self.placement,
            environments=self.environments,
            changes=self.changes,
            dispatcher=self.dispatcher,
        )
        self.outputs = OutputKeeper(store, self.layout, self.access, self.gangs, self.output_limits)

    def _build_job_side(self) -> None:
        """Jobs in, jobs once stored, and the moves the cloud lifecycle makes on them."""
        store, layout = self.store, self.layout
        self.jobs = JobService(
            store,
            self.states,
            layout=layout,
            bundles=self.bundles,
            environments=self.environments,
            changes=self.changes,
            worker_views=self.workers.worker_views,
        )
        self.submissions = Submissions(
            store,
            layout=layout,
            bundles=self.bundles,
            jobs=self.jobs,
            environments=self.environments,
            dispatcher=self.dispatcher,
            changes=self.changes,
            cloud=self.cloud,
            worker_views=self.workers.worker_views,
            default_target=self.default_target,
        )
        self.cloud_moves = CloudJobMoves(
            store,
            self.states,
            layout=layout,
            changes=self.changes,
            dispatcher=self.dispatcher,
            jobs=self.jobs,
            workers=self.workers,
            environments=self.environments,
        )

    def touch(self) -> None:
        """A call was answered (see ServingClock)."""
        self.clock.touch()

    @property
    def serving(self) -> bool:
        """Whether this control plane has answered a call yet."""
        return self.clock.serving

    @property
    def last_call(self) -> float:
        return self.clock.last_call
