"""Jobs in: specs validated, their target chosen, their source and inputs taken, stored queued
(or failed as unschedulable) and handed to placement. All or nothing: a refused spec keeps
nothing, an uploaded bundle included."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpulayer.control.bundle_store import BundleStore
from gpulayer.control.changes import ChangeFeed
from gpulayer.control.cloud_gate import CloudGate
from gpulayer.control.dispatcher import Dispatcher
from gpulayer.control.job_service import JobService
from gpulayer.control.paths import HomeLayout
from gpulayer.control.store import JobRecord, QueuedHead, Store
from gpulayer.control.store.once_keys import OnceKey
from gpulayer.control.submit_environments import SubmitEnvironments
from gpulayer.control.targets import (
    TargetDecision,
    WorkerView,
    choose_target,
    may_leave_this_machine,
    refuse_missing_inputs,
    refuse_unschedulable,
    refuse_unshipped_inputs,
    with_default_target,
)
from gpulayer.control.text_checks import unsafe_text
from gpulayer.errors import SpecError, UsageError
from gpulayer.ids import new_id
from gpulayer.spec import JobSpec
from gpulayer.spec.validate import validate_spec

ListItem = tuple[dict[str, Any], str | None, str | None]
"""A list submit's item: spec data, working dir, bundle digest."""


class Submissions:
    def __init__(
        self,
        store: Store,
        *,
        layout: HomeLayout,
        bundles: BundleStore,
        jobs: JobService,
        environments: SubmitEnvironments,
        dispatcher: Dispatcher,
        changes: ChangeFeed,
        cloud: CloudGate,
        worker_views: Callable[[], list[Any]],
        default_target: str,
    ) -> None:
        self.store = store
        self.layout = layout
        self.bundles = bundles
        self.jobs = jobs
        self.environments = environments
        self.dispatcher = dispatcher
        self.changes = changes
        self.cloud = cloud
        self.worker_views = worker_views
        self.default_target = default_target
        """The target of a job whose spec names none: a team server's is remote (it has no
        local worker)."""

    def submit(
        self,
        spec_data: dict[str, Any],
        *,
        working_dir: str | None = None,
        bundle: Path | None = None,
        source_dir: Path | None = None,
        client_env: dict[str, str] | None = None,
        warnings: list[str] | None = None,
        bundle_digest: str | None = None,
        once: OnceKey | None = None,
    ) -> JobRecord:
        """Validate, choose a target, persist.

        `bundle` is an uploaded source tarball to keep for the job, `bundle_digest` one the
        bundle store keeps (the job's row names it); `source_dir` a local
        directory to snapshot into one (what changed meanwhile is added to `warnings`).
        Nothing is kept when the spec does not validate.
        """
        spec, views, decision = self._accepted(
            spec_data, working_dir, source_dir, bundle, bundle_digest
        )
        hint = self._no_remote_worker_hint(decision, views)
        if hint is not None:
            decision.notes.append(hint)
            if warnings is not None:
                warnings.append(hint)
        job_id = new_id("j")
        if source_dir is None and bundle is None and working_dir and may_leave_this_machine(spec):
            # Taken now, so later edits do not leak into the queued job; a run on this
            # machine's own worker still runs in place.
            source_dir = Path(working_dir)
        if source_dir is not None:
            bundle = self._bundle_of(spec, source_dir, working_dir, warnings)
        if client_env is not None and "cloud" in spec.placement.targets:
            from gpulayer.cloud.credentials import credential_variables

            # In memory only, for as long as the job may rent or end a machine; kept before
            # the job is, since the lifecycle loop may plan it at once.
            self.environments.keep_cloud(job_id, credential_variables(client_env))
            self.environments.keep_secrets(job_id, spec, client_env)
        try:
            job = self._insert(job_id, spec, decision, working_dir, bundle, bundle_digest, once)
        except Exception:
            self.environments.forget_cloud(job_id)
            raise
        self.dispatcher.jobs_stored(_heads_of([job]), {job.id: (spec, job.labels)})
        if decision.notes or not decision.target:
            # Else the dispatch pass below tells whoever waits on a change.
            self.changes.log_system(job.id, 0, decision.notes)
        if client_env is not None and decision.target == "local":
            self.environments.keep_client(job.id, client_env)
        if decision.target:
            self.dispatcher.dispatch()
        return self.store.get_job(job.id)

    def _accepted(
        self,
        spec_data: dict[str, Any],
        working_dir: str | None,
        source_dir: Path | None,
        bundle: Path | None,
        bundle_digest: str | None,
    ) -> tuple[JobSpec, list[Any], TargetDecision]:
        """The spec, the workers seen and its target, or the refusal (an uploaded bundle is
        dropped with it)."""
        try:
            spec, views, decision, _ = self._decide(spec_data)
            refuse_unschedulable(spec, decision)
            base = working_dir or source_dir
            if decision.target == "local" and self.default_target == "local" and base:
                # The job runs on this machine, where its local inputs are read: one that is
                # not there now is refused rather than failed once the job starts.
                refuse_missing_inputs(spec, Path(base))
            refuse_unshipped_inputs(spec, self._shipped_inputs(spec, bundle or bundle_digest, base))
        except Exception:
            if bundle is not None:
                bundle.unlink(missing_ok=True)
            raise
        return spec, views, decision

    def _insert(
        self,
        job_id: str,
        spec: JobSpec,
        decision: TargetDecision,
        working_dir: str | None,
        bundle: Path | None,
        bundle_digest: str | None,
        once: OnceKey | None,
    ) -> JobRecord:
        """The job's row, naming its bundle (kept now when uploaded or snapshotted)."""
        with self.bundles.lock:
            kept_here = bundle is not None
            if bundle is not None:
                bundle_digest = self.bundles.keep(bundle)
            elif bundle_digest is not None:
                self.bundles.require(bundle_digest)
            try:
                return self.store.insert_job(
                    **_job_row(job_id, spec, spec.model_dump(mode="json"), decision),
                    working_dir=working_dir,
                    bundle_digest=bundle_digest,
                    once=once,
                )
            except Exception:
                if kept_here and bundle_digest is not None:
                    self.jobs.release_unused_bundle(bundle_digest)
                raise

    def _bundle_of(
        self,
        spec: JobSpec,
        source_dir: Path,
        working_dir: str | None,
        warnings: list[str] | None,
    ) -> Path:
        """``source_dir`` snapshot as a bundle in the store's staging folder, for keep()."""
        from gpulayer.protocol.bundle import bundle_warning, create_bundle, local_input_paths

        inputs = None
        if may_leave_this_machine(spec):
            artifacts = [i.artifact for i in spec.inputs]
            inputs = local_input_paths(artifacts, Path(working_dir or source_dir))
        staged = self.bundles.staging_path()
        try:
            info = create_bundle(source_dir, staged, exclude=[self.layout.root], inputs=inputs)
        except Exception:
            staged.unlink(missing_ok=True)
            raise
        warning = bundle_warning(info)
        if warning and warnings is not None:
            warnings.append(warning)
        return staged

    def _shipped_inputs(
        self, spec: JobSpec, bundle: Path | str | None, base: Path | str | None
    ) -> set[int]:
        """The job's local-path inputs (by index) that travel in its bundle: an uploaded file,
        a kept one by digest, or the one this service makes of ``base`` (which carries those
        that exist there)."""
        from gpulayer.protocol.bundle import (
            is_machine_path,
            local_input_paths,
            shipped_input_indexes,
        )

        artifacts = [i.artifact for i in spec.inputs]
        if not may_leave_this_machine(spec) or not any(map(is_machine_path, artifacts)):
            return set()
        if isinstance(bundle, Path):
            return shipped_input_indexes(bundle)
        if bundle is not None:
            return shipped_input_indexes(self.bundles.path(bundle))
        if base is not None:
            return set(local_input_paths(artifacts, Path(base)))
        return set()

    def plan(
        self,
        spec_data: dict[str, Any],
        *,
        working_dir: str | None = None,
        cloud_env: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Where the job would run and why (see gpulayer.control.plan), deciding as submit
        does; nothing is kept, uploaded or rented. What submit would refuse as bad input (a
        local input that is not there, read from ``working_dir``) raises as it would there.
        ``cloud_env``: the caller's cloud credential variables, which the clouds are asked
        with, as a submit's cloud job's machine is rented with them (memory only)."""
        from gpulayer.cloud.credentials import using_environment
        from gpulayer.control.plan import plan_job

        with using_environment(cloud_env):
            spec, views, decision, cloud = self._decide(spec_data)
            if decision.target == "local" and self.default_target == "local" and working_dir:
                refuse_missing_inputs(spec, Path(working_dir))
            return plan_job(spec, views, decision, self.cloud.plan if cloud else None)

    def _decide(self, spec_data: dict[str, Any]) -> tuple[JobSpec, list[Any], TargetDecision, bool]:
        """The spec validated and its target chosen, as submit and plan both decide: with the
        workers seen and whether a cloud is at hand."""
        problems = unsafe_text(spec_data)
        if problems:
            raise SpecError(problems)
        spec = validate_spec(with_default_target(spec_data, self.default_target))
        # Checked only for jobs that may go to a cloud: it validates providers.yaml, whose
        # errors (ConfigError, exit 2) then refuse the job before anything is kept.
        cloud = "cloud" in spec.placement.targets and self.cloud.available()
        views = self.worker_views()
        decision = choose_target(
            spec, views, cloud_available=cloud, cloud_refusal=self.cloud.refusal
        )
        return spec, views, decision, cloud

    def _no_remote_worker_hint(
        self, decision: TargetDecision, views: Sequence[WorkerView]
    ) -> str | None:
        """On the local control plane, a job left waiting for a remote worker when none is
        registered: how one joins it (it waits, since one may)."""
        if self.default_target != "local" or decision.target != "remote":
            return None
        if any(view.kind == "remote" for view in views):
            return None
        return (
            "hint: no remote worker is registered with this machine's control plane; the job "
            "waits for one (`gpulayer token create --worker`, then `gpulayer worker start "
            "--server URL` elsewhere), or submit to a team server with GPULAYER_SERVER set"
        )

    def submit_many(
        self,
        items: Sequence[ListItem],
        *,
        once: OnceKey | None = None,
        client_envs: Sequence[dict[str, str] | None] | None = None,
    ) -> list[JobRecord]:
        """Several jobs at once: (spec data, working dir, bundle digest) each. All are
        validated before any is kept (SpecError lines name ``jobs[i]``), then stored in one
        transaction and placed by one dispatch pass. ``client_envs``: each job's submitting
        environment, kept as submit keeps one job's (the local control plane)."""
        specs = self._validated_list(items)
        with self.bundles.lock:
            for named in {digest for _, _, digest in items if digest is not None}:
                self.bundles.require(named)
            rows, notes = self._list_rows(specs, items)
            envs = list(client_envs or [None] * len(rows))
            self._keep_environments(rows, specs, envs, cloud=True)
            jobs = self.store.insert_jobs(rows, once=once)
        self._keep_environments(rows, specs, envs, cloud=False)
        self.store.append_logs_many(
            [(job_id, 0, [("system", note) for note in job_notes]) for job_id, job_notes in notes]
        )
        self.dispatcher.jobs_stored(
            _heads_of(jobs),
            {job.id: (spec, job.labels) for job, (spec, _, _) in zip(jobs, specs, strict=True)},
        )
        if any(job.state == "queued" for job in jobs):
            self.dispatcher.dispatch()
        else:
            self.changes.notify()
        return self.store.get_jobs([job.id for job in jobs])

    def _keep_environments(
        self,
        rows: list[dict[str, Any]],
        specs: list[tuple[JobSpec, dict[str, Any], str]],
        envs: list[dict[str, str] | None],
        *,
        cloud: bool,
    ) -> None:
        """Cloud credentials before the jobs are stored (the lifecycle may plan them at
        once), the whole environment of local jobs after, as submit() does for one job."""
        for row, (spec, _, _), env in zip(rows, specs, envs, strict=True):
            if env is None:
                continue
            if cloud and "cloud" in spec.placement.targets:
                from gpulayer.cloud.credentials import credential_variables

                self.environments.keep_cloud(row["job_id"], credential_variables(env))
                self.environments.keep_secrets(row["job_id"], spec, env)
            elif not cloud and row["target"] == "local" and row["state"] == "queued":
                self.environments.keep_client(row["job_id"], env)

    def _validated_list(
        self, items: Sequence[ListItem]
    ) -> list[tuple[JobSpec, dict[str, Any], str]]:
        """Each item's spec, the JSON it is stored as and its canonical text; SpecError with
        every item's problems, each line naming ``jobs[i]``."""
        # A list often repeats one spec (launch_many, map, arrays): each distinct spec is
        # checked, validated, stored as JSON and placed once per call; the same data always
        # gives the same outcome against this call's one reading of the workers.
        checked: dict[str, tuple[JobSpec, dict[str, Any]] | SpecError] = {}
        specs: list[tuple[JobSpec, dict[str, Any], str]] = []
        problems: list[str] = []
        for index, (spec_data, _, _) in enumerate(items):
            key = _canonical(spec_data)
            outcome = checked.get(key)
            if outcome is None:
                with_target = with_default_target(spec_data, self.default_target)
                outcome = checked[key] = _checked_spec(with_target)
            if isinstance(outcome, SpecError):
                problems.extend(f"jobs[{index}].{line}" for line in outcome.lines)
            else:
                specs.append((*outcome, key))
        for index, ((spec, _, _), (_, _, digest)) in enumerate(
            zip(specs, items, strict=True) if not problems else ()
        ):
            try:
                # Only a bundle carries them: a list's working_dir is never bundled here.
                refuse_unshipped_inputs(spec, self._shipped_inputs(spec, digest, None))
            except UsageError as exc:
                problems.append(f"jobs[{index}].{exc}")
        if problems:
            raise SpecError(problems)
        return specs

    def _list_rows(
        self, specs: list[tuple[JobSpec, dict[str, Any], str]], items: Sequence[ListItem]
    ) -> tuple[list[dict[str, Any]], list[tuple[str, list[str]]]]:
        """The rows a list submit stores, and the notes of each job that has some."""
        views = self.worker_views()
        cloud_ready: bool | None = None
        rows: list[dict[str, Any]] = []
        notes: list[tuple[str, list[str]]] = []
        decisions: dict[str, TargetDecision] = {}
        for (spec, stored, key), (_, working_dir, digest) in zip(specs, items, strict=True):
            decision = decisions.get(key)
            if decision is None:
                cloud = False
                if "cloud" in spec.placement.targets:
                    if cloud_ready is None:
                        cloud_ready = self.cloud.available()
                    cloud = cloud_ready
                decision = decisions[key] = choose_target(
                    spec, views, cloud_available=cloud, cloud_refusal=self.cloud.refusal
                )
            refuse_unschedulable(spec, decision, f"jobs[{len(rows)}].")
            job_id = new_id("j")
            rows.append(
                {
                    **_job_row(job_id, spec, stored, decision),
                    "working_dir": working_dir,
                    "bundle_digest": digest,
                }
            )
            if decision.notes:
                notes.append((job_id, list(decision.notes)))
        return rows, notes


def _job_row(
    job_id: str, spec: JobSpec, stored: dict[str, Any], decision: TargetDecision
) -> dict[str, Any]:
    """A new job's row as its target decision makes it: queued, or failed unschedulable."""
    return {
        "job_id": job_id,
        "name": spec.name,
        "spec": stored,
        "state": "queued" if decision.target else "failed",
        "target": decision.target or spec.placement.target,
        "labels": dict(spec.labels),
        "reason": None if decision.target else "unschedulable",
        "message": decision.message or decision.skipped,
    }


def _canonical(spec_data: Any) -> str:
    """One text per spec data, whatever its keys' order (a spec is plain JSON data)."""
    import json

    try:
        return json.dumps(spec_data, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return f"unkeyed:{id(spec_data)}"  # not JSON data: checked on its own, and refused


def _checked_spec(spec_data: Any) -> tuple[JobSpec, dict[str, Any]] | SpecError:
    """The validated spec and the JSON it is stored as, or why it is refused."""
    try:
        found = unsafe_text(spec_data)
        if found:
            raise SpecError(found)
        spec = validate_spec(spec_data)
    except SpecError as exc:
        return exc
    return spec, spec.model_dump(mode="json")


def _heads_of(jobs: Sequence[JobRecord]) -> list[QueuedHead]:
    return [QueuedHead(job.id, job.target, job.created_at) for job in jobs if job.state == "queued"]
