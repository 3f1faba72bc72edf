"""Runs one attempt of a job on this machine: prepare, start, stream, end, report.

Preparation happens in this order, and any failure ends the attempt before the job's code
runs: secrets (read from the worker's environment), the launch line, the source bundle, the
inputs. The job then runs as a child process in a session of its own (see :mod:`process`),
and its whole process tree is ended when it exits, times out or is cancelled.

A per-attempt ``job_dir`` holds::

    work/       the unpacked bundle, the job's working directory
    input/      staged inputs (GPULAYER_INPUT_DIR)
    output/     what the job leaves for upload (GPULAYER_OUTPUT_DIR)
    tmp/        the job's TMPDIR, where it runs as a user of its own
    .gpulayer/  the function call and its result, between the runner and the shim
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import JsonValue

from gpulayer.errors import ControlPlaneError, GpulayerError
from gpulayer.protocol.bundle import BundleError, extract_bundle
from gpulayer.spec.models import (
    CommandWorkload,
    DistributedWorkload,
    FunctionWorkload,
    JobSpec,
    SecretRef,
    Setup,
    is_reserved_env_name,
)
from gpulayer.worker import outside_files
from gpulayer.worker.containment import TAG_VARIABLE, AttemptGroup
from gpulayer.worker.distributed import NodePlace, launch_argv, launch_env
from gpulayer.worker.function_result import read_result as _read_result
from gpulayer.worker.process import LogSink, OutputPump, ProcessTree, Redactor, RunAs
from gpulayer.worker.setup_env import (
    WORKER_SITE_VARIABLE,
    SetupCancelled,
    SetupError,
    SetupRunner,
    worker_site_dirs,
)
from gpulayer.worker.staging import StagingError, stage_inputs
from gpulayer.worker.train_reports import REPORTS_FILE, REPORTS_VARIABLE, read_reports

if TYPE_CHECKING:
    from gpulayer.worker.warm_pool import WarmEntry, WarmItem

FUNCTION_SHIM = Path(__file__).with_name("function_shim.py")

_PYTHON_NAMES = frozenset({"python", "python3"})
_REFRESH_SECONDS = 1.0
_POLL_SECONDS = 0.05

State = Literal["succeeded", "failed", "cancelled"]
Reason = Literal[
    "exit_code",
    "timeout",
    "cancelled",
    "secret_missing",
    "input_missing",
    "setup_failed",
    "function_error",
]


class SecretMissingError(GpulayerError):
    """A secret the job needs is not in the worker's environment."""

    def __init__(self, secret: SecretRef) -> None:
        super().__init__(f"secret {secret.name}: key {secret.key} is not set on the worker")
        self.secret = secret


@dataclass
class RunContext:
    job_id: str
    attempt: int
    spec: JobSpec
    job_dir: Path
    bundle: Path | None = None
    source_dir: Path | None = None
    resolve_artifact: Callable[[str], Path] | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    worker_env: Mapping[str, str] | None = None
    """The environment the job starts from and its secrets are read from; os.environ when None.
    A local job gets the environment its `submit` ran in, as if run from that shell."""
    python: str = sys.executable
    kill_grace_seconds: float = 5.0
    """Between SIGTERM and SIGKILL for what a job left running once it exited, or when the
    worker itself fails; a cancel or a timeout gives the job its spec's grace_seconds."""
    group: AttemptGroup | None = None
    """Where the attempt's processes are kept together (a cgroup, or a tag they carry)."""
    run_as: RunAs | None = None
    """The unprivileged user the job runs as, when the worker runs as root."""
    node: NodePlace | None = None
    """This node's place in its gang, for a distributed job of several nodes."""
    setup_cache: Path | None = None
    """Where the environments of jobs' ``setup`` are kept and reused; the attempt's own
    folder when None."""
    machine_paths: bool = False
    """Whether the job's local-path inputs are opened on this machine: only for the worker
    that runs as the user who submitted the job on this machine (see :mod:`staging`)."""
    masked: tuple[str, ...] = ()
    """Values besides the job's secrets that never appear in its log: the worker's own
    credentials."""
    warm: WarmEntry | None = None
    """Where a function job runs in a warm interpreter shared with other items of its
    function, source and environment (see :mod:`warm_pool`); a process of its own when None."""
    rented_machine: bool = False
    """The worker of a rented machine: what a job leaves in its working folder is deleted
    with the machine, so the job's end names it."""


@dataclass
class RunOutcome:
    state: State
    reason: Reason | None
    exit_code: int | None
    result: JsonValue | None
    message: str | None
    output_dir: Path


class _SetupFailed(Exception):
    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason: Reason = reason
        self.message = message


def resolve_secrets(secrets: list[SecretRef], worker_env: Mapping[str, str]) -> dict[str, str]:
    """Secret name -> value, read from ``worker_env`` by each secret's key."""
    resolved = {}
    for secret in secrets:
        key = secret.key or secret.name
        if key not in worker_env:
            raise SecretMissingError(secret)
        resolved[secret.name] = worker_env[key]
    return resolved


def inherited_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The worker's environment less the names gpulayer and torchrun set themselves: the
    worker's own GPULAYER_* settings (its token among them) are not the job's business."""
    return {k: v for k, v in environ.items() if not is_reserved_env_name(k)}


def job_env(
    ctx: RunContext,
    secrets: Mapping[str, str],
    workload_env: Mapping[str, str],
    *,
    environ: Mapping[str, str],
) -> dict[str, str]:
    env = inherited_env(environ)
    env["PYTHONUNBUFFERED"] = "1"  # Python jobs stream live; a job's env may still say 0
    env.update(ctx.spec.env)
    env.update(secrets)
    env.update(
        GPULAYER_JOB_ID=ctx.job_id,
        GPULAYER_ATTEMPT=str(ctx.attempt),
        GPULAYER_INPUT_DIR=str(ctx.job_dir / "input"),
        GPULAYER_OUTPUT_DIR=str(ctx.job_dir / "output"),
    )
    env.update(workload_env)
    env.update(ctx.extra_env)
    return env


def command_argv(command: list[str], python: str) -> list[str]:
    if command[0] in _PYTHON_NAMES:
        return [python, *command[1:]]
    return list(command)


def _one_line(text: str, limit: int = 2000) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    return f"exited with code {code}"


class JobRun:
    """One attempt of one job. ``on_log(stream, text)`` receives the job's output as it
    comes, from a background thread: ``text`` is one line ending in a newline, or a partial
    line flushed because the job paused mid-line; joined they give the output exactly (less
    masked secrets). "system" lines are the runner's own."""

    def __init__(self, ctx: RunContext, on_log: LogSink) -> None:
        self.ctx = ctx
        self._on_log = on_log
        self._log_lock = threading.Lock()
        self._cancelled = threading.Event()
        self._wake_lock = threading.Lock()
        self._wake_write: int | None = None
        """While the job runs, writing here wakes the supervisor's wait (a cancel)."""
        self._started = False
        self._redactor = Redactor(ctx.masked)
        self._python = ctx.python
        self.leader_pid: int | None = None

    @property
    def work_dir(self) -> Path:
        return self.ctx.job_dir / "work"

    @property
    def input_dir(self) -> Path:
        return self.ctx.job_dir / "input"

    @property
    def output_dir(self) -> Path:
        return self.ctx.job_dir / "output"

    @property
    def tmp_dir(self) -> Path:
        return self.ctx.job_dir / "tmp"

    @property
    def control_dir(self) -> Path:
        return self.ctx.job_dir / ".gpulayer"

    @property
    def result_file(self) -> Path:
        return self.control_dir / "result.json"

    @property
    def reports_file(self) -> Path:
        return self.control_dir / REPORTS_FILE

    def cancel(self) -> None:
        """End the job's whole process tree; run() returns cancelled. Safe from any thread,
        before or during run()."""
        self._cancelled.set()
        with self._wake_lock:
            if self._wake_write is not None:
                with contextlib.suppress(OSError):  # a full pipe is awake already
                    os.write(self._wake_write, b"x")

    def _log(self, stream: str, text: str) -> None:
        with self._log_lock:
            self._on_log(stream, text)

    def _system(self, text: str) -> None:
        self._log("system", self._redactor.redact(_one_line(text)) + "\n")

    def _outcome(
        self,
        state: State,
        reason: Reason | None,
        *,
        exit_code: int | None = None,
        result: JsonValue | None = None,
        message: str | None = None,
    ) -> RunOutcome:
        if message is not None:
            message = self._redactor.redact(_one_line(message))
        return RunOutcome(state, reason, exit_code, result, message, self.output_dir)

    # --- preparation ----------------------------------------------------------------------

    def _resolve_secrets(self) -> dict[str, str]:
        ctx = self.ctx
        try:
            secrets = resolve_secrets(
                ctx.spec.secrets, os.environ if ctx.worker_env is None else ctx.worker_env
            )
        except SecretMissingError as exc:
            raise _SetupFailed("secret_missing", str(exc)) from None
        self._redactor = Redactor([*secrets.values(), *ctx.masked])
        return secrets

    def _prepare_workspace(self) -> Path:
        """Unpacks the bundle and stages the inputs; returns the working directory."""
        ctx = self.ctx
        if ctx.bundle is not None:
            try:
                extract_bundle(ctx.bundle, self.work_dir)
            except BundleError as exc:
                raise _SetupFailed("setup_failed", str(exc)) from None
            cwd = self.work_dir
        elif ctx.source_dir is not None:
            cwd = ctx.source_dir
        else:
            self.work_dir.mkdir(parents=True, exist_ok=True)
            cwd = self.work_dir
        if not cwd.is_dir():
            raise _SetupFailed("setup_failed", f"source: {cwd} is not a directory")
        try:
            stage_inputs(
                ctx.spec.inputs,
                self.input_dir,
                source_dir=cwd,
                resolve_artifact=ctx.resolve_artifact,
                machine_paths=ctx.machine_paths,
            )
        except StagingError as exc:
            reason: Reason = "input_missing" if exc.reason == "input_missing" else "setup_failed"
            raise _SetupFailed(reason, str(exc)) from None
        return cwd

    def _launch(self) -> tuple[list[str], dict[str, str]]:
        """The argv to run and the workload's own environment additions."""
        workload = self.ctx.spec.workload
        python = self._python
        if isinstance(workload, CommandWorkload):
            return command_argv(workload.command, python), {}
        env = {
            "GPULAYER_FUNCTION_CALL": str(self.control_dir / "call.json"),
            "GPULAYER_FUNCTION_RESULT": str(self.result_file),
            REPORTS_VARIABLE: str(self.reports_file),
        }
        if isinstance(workload, FunctionWorkload):
            self._write_call(workload.entrypoint, workload.args, workload.kwargs)
            return [python, str(FUNCTION_SHIM)], env
        node = self.ctx.node
        try:
            argv = launch_argv(
                workload,
                python=python,
                function_shim=FUNCTION_SHIM,
                job_id=self.ctx.job_id,
                node=node,
            )
        except GpulayerError as exc:
            raise _SetupFailed("setup_failed", str(exc)) from None
        if workload.command is not None:
            return command_argv(argv, python), launch_env(workload, node)
        if workload.function is None:
            return argv, launch_env(workload, node)
        self._write_call(workload.function, workload.function_args, workload.function_kwargs)
        return argv, {**env, **launch_env(workload, node)}

    def _write_call(
        self, entrypoint: str, args: list[JsonValue], kwargs: dict[str, JsonValue]
    ) -> None:
        call = {"entrypoint": entrypoint, "args": args, "kwargs": kwargs}
        (self.control_dir / "call.json").write_text(json.dumps(call), encoding="utf-8")

    # --- running --------------------------------------------------------------------------

    def run(self) -> RunOutcome:
        if self._started:
            raise RuntimeError("a JobRun runs once; make a new one for another attempt")
        self._started = True
        try:
            if self._cancelled.is_set():
                raise _SetupFailed("cancelled", "cancelled before start")
            folders = [self.input_dir, self.output_dir]
            if not isinstance(self.ctx.spec.workload, CommandWorkload):
                # Only a function's or a launcher's job is handed files in it (its call, its
                # result, its reports); each folder is an inode made per attempt.
                folders.append(self.control_dir)
            for path in folders:
                path.mkdir(parents=True, exist_ok=True)
            # Cheapest checks first: nothing is unpacked or copied for a job that cannot run.
            secrets = self._resolve_secrets()
            argv, workload_env = self._launch()
            cwd = self._prepare_workspace()
            before = outside_files.snapshot(cwd) if self.ctx.rented_machine else None
            if self._cancelled.is_set():
                raise _SetupFailed("cancelled", "cancelled before start")
            env = self._environment(secrets, workload_env)
            if self.ctx.spec.setup is not None:
                self._run_setup(self.ctx.spec.setup, cwd, env)
                argv, workload_env = self._launch()  # now with the setup's interpreter
                env = self._environment(secrets, workload_env)
        except ControlPlaneError:
            raise  # its worker reports the attempt lost with its control plane
        except (OSError, GpulayerError) as exc:
            failed = _SetupFailed("setup_failed", f"preparing the job failed: {exc}")
            self._system(failed.message)
            return self._outcome("failed", failed.reason, message=failed.message)
        except _SetupFailed as failed:
            self._system(failed.message)
            if failed.reason == "cancelled":
                return self._outcome("cancelled", "cancelled", message=failed.message)
            return self._outcome("failed", failed.reason, message=failed.message)
        outcome = self._with_reports(self._supervise(argv, cwd, env))
        policy = self.ctx.spec.outputs
        owner = self.ctx.run_as.uid if self.ctx.run_as is not None else None
        outside_files.after_run(
            cwd, policy.paths if policy else [], self.output_dir, owner, before, self._system
        )
        return outcome

    def _environment(self, secrets: dict[str, str], workload_env: dict[str, str]) -> dict[str, str]:
        base = os.environ if self.ctx.worker_env is None else self.ctx.worker_env
        env = job_env(self.ctx, secrets, workload_env, environ=base)
        if self._python != self.ctx.python:
            # The setup's environment comes first, its console scripts included.
            bin_dir = str(Path(self._python).parent)
            env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", os.defpath)])
            env["VIRTUAL_ENV"] = str(Path(bin_dir).parent)
            env[WORKER_SITE_VARIABLE] = worker_site_dirs()
        run_as = self.ctx.run_as
        if run_as is not None:
            env.update(HOME=run_as.home, USER=run_as.name, LOGNAME=run_as.name)
            if "TMPDIR" not in self.ctx.spec.env:
                # Its temp files stay in its own folder, out of the shared /tmp.
                self.tmp_dir.mkdir(mode=0o700, exist_ok=True)
                env["TMPDIR"] = str(self.tmp_dir)
            run_as.own(self.ctx.job_dir)
            self.ctx.job_dir.chmod(0o700)  # no other job's user may look in
        if self.ctx.group is not None:
            env[TAG_VARIABLE] = self.ctx.group.tag
        return env

    def _run_setup(self, setup: Setup, cwd: Path, env: dict[str, str]) -> None:
        """The job's commands and packages, before it runs; raises _SetupFailed."""
        try:
            runner = SetupRunner(
                cwd=cwd,
                env=env,
                log=self._system,
                cancelled=self._cancelled,
                redactor=self._redactor,
                group=self.ctx.group,
                run_as=self.ctx.run_as,
                helper_env=inherited_env(
                    os.environ if self.ctx.worker_env is None else self.ctx.worker_env
                ),
                machine_paths=self.ctx.machine_paths,
            )
            cache = self.ctx.setup_cache or self.ctx.job_dir / "setup-envs"
            self._python = runner.run(setup, cache)
        except SetupCancelled:
            raise _SetupFailed("cancelled", "cancelled during setup") from None
        except SetupError as exc:
            raise _SetupFailed("setup_failed", str(exc)) from None

    def _with_reports(self, outcome: RunOutcome) -> RunOutcome:
        """A Trainer run that ended without returning keeps the reports rank 0 made; a
        successful one carries them in its result already."""
        if outcome.state == "succeeded" or outcome.result is not None:
            return outcome
        reports = read_reports(self.ctx.job_dir, f"{self.control_dir.name}/{REPORTS_FILE}")
        if not reports:
            return outcome
        node = self.ctx.node.node_rank if self.ctx.node is not None else 0
        outcome.result = {"value": None, "metrics": reports, "node_rank": node}
        return outcome

    def _supervise(self, argv: list[str], cwd: Path, env: dict[str, str]) -> RunOutcome:
        self._system(f"running {shlex.join(argv)} in {cwd}")
        try:
            tree = self._spawn(argv, cwd, env)
        except OSError as exc:
            message = f"cannot start {argv[0]!r}: {exc.strerror or exc}"
            self._system(message)
            return self._outcome("failed", "setup_failed", message=message)
        self.leader_pid = tree.pid
        grace = self.ctx.kill_grace_seconds
        assert tree.popen.stdout is not None and tree.popen.stderr is not None
        pump = OutputPump(
            {"stdout": tree.popen.stdout.fileno(), "stderr": tree.popen.stderr.fileno()},
            self._log,
            redactor=self._redactor,
        )
        try:
            pump.start()
            ending = self._wait(tree)
        except BaseException:
            # Ctrl-C in the worker, or a bug here: the job must not outlive its supervisor.
            tree.terminate(grace)
            pump.finish(timeout=grace)
            tree.close()
            raise
        if ending != "exited":
            # The job gets its grace: SIGTERM now, SIGKILL once grace_seconds have passed.
            grace = self.ctx.spec.grace_seconds
            stopping = f"stopping the job (SIGTERM, then SIGKILL after {grace:g} s)"
            if ending == "timeout":
                self._system(f"timed out after {self.ctx.spec.timeout_seconds:g} s; {stopping}")
            else:
                self._system(f"cancelled; {stopping}")
        left = tree.terminate(grace)
        if ending == "exited" and left:
            self._system(f"ended {left} process(es) the job left running")
        if not pump.finish(timeout=self.ctx.kill_grace_seconds):
            self._system("a process outside the job still holds its output open; stopped reading")
        code = tree.close()
        self._system(_describe_exit(code))
        if ending == "cancelled":
            return self._outcome("cancelled", "cancelled", exit_code=code, message="cancelled")
        if ending == "timeout":
            message = f"timed out after {self.ctx.spec.timeout_seconds:g} s"
            return self._outcome("failed", "timeout", exit_code=code, message=message)
        return self._finished(code)

    def _spawn(self, argv: list[str], cwd: Path, env: dict[str, str]) -> ProcessTree | WarmItem:
        ctx = self.ctx
        if ctx.warm is not None and isinstance(ctx.spec.workload, FunctionWorkload):
            item = ctx.warm.item(ctx, python=argv[0], cwd=cwd, env=env, note=self._system)
            if item is not None:
                return item
        if ctx.warm is not None:
            ctx.warm.make_room(env)  # no idle interpreter keeps this job's GPUs from it
        return ProcessTree.spawn(argv, cwd=cwd, env=env, group=ctx.group, run_as=ctx.run_as)

    def _wait(self, tree: ProcessTree | WarmItem) -> Literal["exited", "timeout", "cancelled"]:
        """Until the job's leader exits, its time is up or it is cancelled: woken by each
        of these at once (by polling the leader where the kernel cannot tell its exit)."""
        timeout = self.ctx.spec.timeout_seconds
        deadline = None if timeout is None else time.monotonic() + timeout
        # Not at once: the tree is its leader alone at first, and most short jobs end
        # before a scan of every process on the machine would find anything more.
        next_refresh = time.monotonic() + _REFRESH_SECONDS
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        with self._wake_lock:
            self._wake_write = wake_write
        try:
            while True:
                if tree.exited() is not None:
                    return "exited"
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return "timeout"
                if self._cancelled.is_set():
                    return "cancelled"
                if now >= next_refresh:
                    tree.refresh()
                    next_refresh = now + _REFRESH_SECONDS
                wait = next_refresh - now if tree.sees_exit else _POLL_SECONDS
                if deadline is not None:
                    wait = min(wait, deadline - now)
                tree.wait_exit(max(0.0, wait), wake_read)
        finally:
            with self._wake_lock:
                self._wake_write = None
            os.close(wake_read)
            os.close(wake_write)

    def _finished(self, code: int) -> RunOutcome:
        workload = self.ctx.spec.workload
        if isinstance(workload, CommandWorkload) or (
            isinstance(workload, DistributedWorkload) and workload.function is None
        ):
            if code == 0:
                return self._outcome("succeeded", None, exit_code=0)
            return self._outcome(
                "failed", "exit_code", exit_code=code, message=_describe_exit(code)
            )
        if isinstance(workload, DistributedWorkload):
            return self._function_outcome(code, self._ranked_result(workload.procs_per_worker))
        return self._function_outcome(code, _read_result(self.ctx.job_dir, self.result_file.name))

    def _ranked_result(self, local_ranks: int) -> dict[str, JsonValue] | None:
        """This node's ranks' outcome: a failure naming its rank if one failed, else rank 0's
        result where rank 0 ran here, else success without a value (another node ran rank 0;
        its value is the job's). None when a rank ended without a result."""
        prefix = self.result_file.name + "."
        results: dict[int, dict[str, JsonValue] | None] = {}
        for path in self.control_dir.glob(prefix + "*"):
            suffix = path.name[len(prefix) :]
            if suffix.isdigit():
                results[int(suffix)] = _read_result(self.ctx.job_dir, path.name)
        for rank in sorted(results):
            payload = results[rank]
            if payload is not None and not payload.get("ok"):
                return {"ok": False, "error": f"rank {rank}: {payload.get('error')}"}
        if len(results) < local_ranks or any(p is None for p in results.values()):
            return None
        if 0 in results:
            return results[0]
        return {"ok": True, "value": None}

    def _function_outcome(self, code: int, payload: dict[str, JsonValue] | None) -> RunOutcome:
        if payload is None:
            message = f"the function's process ended without a result ({_describe_exit(code)})"
            reason: Reason = "exit_code" if code != 0 else "function_error"
            return self._outcome("failed", reason, exit_code=code, message=message)
        if payload.get("ok") and code == 0:
            return self._outcome("succeeded", None, exit_code=0, result=payload.get("value"))
        error = payload.get("error") if not payload.get("ok") else _describe_exit(code)
        return self._outcome("failed", "function_error", exit_code=code, message=str(error))
