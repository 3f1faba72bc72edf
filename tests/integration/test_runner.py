"""JobRun with command workloads, on real subprocesses: output, env, secrets, inputs,
bundles, timeouts and cancellation."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpulayer.errors import ControlPlaneError
from gpulayer.protocol.bundle import create_bundle
from gpulayer.spec import JobSpec
from gpulayer.worker.runner import JobRun, RunContext, RunOutcome

# A job that waits for the test to answer polls for a file; it gives up (exit 9) after this
# long so that a broken runner fails the test instead of hanging it.
_GIVE_UP = 120


class Logs:
    def __init__(self) -> None:
        self.chunks: list[tuple[str, str]] = []
        self.watchers: list[tuple[str, str, Callable[[], None]]] = []
        self._lock = threading.Lock()

    def __call__(self, stream: str, text: str) -> None:
        with self._lock:
            self.chunks.append((stream, text))
            watchers = list(self.watchers)
        for watched, needle, action in watchers:
            if stream == watched and needle in text:
                action()

    def on(self, needle: str, action: Callable[[], None], stream: str = "stdout") -> None:
        self.watchers.append((stream, needle, action))

    def text(self, stream: str) -> str:
        return "".join(t for s, t in self.chunks if s == stream)

    def all_text(self) -> str:
        return "".join(t for _, t in self.chunks)


def command_spec(*argv: str, **fields: Any) -> JobSpec:
    return JobSpec.model_validate(
        {"workload": {"kind": "command", "command": list(argv)}, **fields}
    )


def py(code: str, **fields: Any) -> JobSpec:
    return command_spec("python", "-c", code, **fields)


def run(spec: JobSpec, tmp_path: Path, logs: Logs | None = None, **ctx: Any) -> RunOutcome:
    context = RunContext(
        job_id=ctx.pop("job_id", "job-1"),
        attempt=ctx.pop("attempt", 1),
        spec=spec,
        job_dir=ctx.pop("job_dir", tmp_path / "attempt"),
        **ctx,
    )
    return JobRun(context, logs if logs is not None else Logs()).run()


def wait_for_file(path: Path) -> str:
    """Job-side code: block until the test creates ``path``."""
    return (
        "import os, time, sys\n"
        f"for _ in range({_GIVE_UP * 20}):\n"
        f"    if os.path.exists({str(path)!r}): break\n"
        "    time.sleep(0.05)\n"
        "else:\n"
        "    sys.exit(9)\n"
    )


def gone(pid: int) -> bool:
    """The process no longer runs (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def printed_pids(logs: Logs) -> list[int]:
    return [int(line[4:]) for line in logs.text("stdout").splitlines() if line.startswith("pid ")]


# --- exit codes and output --------------------------------------------------------------------


def test_success_has_no_reason_or_message(tmp_path: Path) -> None:
    outcome = run(py("print('fine')"), tmp_path)
    assert (outcome.state, outcome.reason, outcome.exit_code, outcome.message) == (
        "succeeded",
        None,
        0,
        None,
    )
    assert outcome.output_dir == tmp_path / "attempt" / "output"


@pytest.mark.parametrize("code", [1, 7, 255])
def test_exit_code_is_propagated(tmp_path: Path, code: int) -> None:
    outcome = run(py(f"import sys; sys.exit({code})"), tmp_path)
    assert (outcome.state, outcome.reason, outcome.exit_code) == ("failed", "exit_code", code)
    assert outcome.message == f"exited with code {code}"


def test_death_by_signal_is_named(tmp_path: Path) -> None:
    outcome = run(py("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"), tmp_path)
    assert (outcome.state, outcome.reason, outcome.exit_code) == ("failed", "exit_code", -9)
    assert outcome.message == "killed by SIGKILL"


def test_lines_arrive_one_by_one_in_order_per_stream(tmp_path: Path) -> None:
    logs = Logs()
    code = (
        "import sys\n"
        "for i in range(300):\n"
        "    print(f'out {i}')\n"
        "    print(f'err {i}', file=sys.stderr)\n"
    )
    outcome = run(py(code), tmp_path, logs)
    assert outcome.state == "succeeded"
    stdout = [t for s, t in logs.chunks if s == "stdout"]
    stderr = [t for s, t in logs.chunks if s == "stderr"]
    assert stdout == [f"out {i}\n" for i in range(300)]
    assert stderr == [f"err {i}\n" for i in range(300)]


def test_a_line_is_delivered_while_the_job_still_runs(tmp_path: Path) -> None:
    answer = tmp_path / "answer"
    logs = Logs()
    logs.on("first", answer.touch)
    code = "print('first')\n" + wait_for_file(answer) + "print('second')\n"
    outcome = run(py(code), tmp_path, logs)
    assert outcome.state == "succeeded", logs.all_text()
    assert logs.text("stdout") == "first\nsecond\n"


def test_a_partial_line_is_flushed_when_the_job_pauses(tmp_path: Path) -> None:
    answer = tmp_path / "answer"
    logs = Logs()
    logs.on("progress 50%", answer.touch)
    code = (
        "import sys\nsys.stdout.write('progress 50%'); sys.stdout.flush()\n"
        + wait_for_file(answer)
        + "print(' then done')\n"
    )
    outcome = run(py(code), tmp_path, logs)
    assert outcome.state == "succeeded", logs.all_text()
    stdout = [t for s, t in logs.chunks if s == "stdout"]
    assert stdout == ["progress 50%", " then done\n"]


def test_stdin_is_empty_and_output_unbuffered(tmp_path: Path) -> None:
    logs = Logs()
    code = "import os, sys; print(repr(sys.stdin.read()), os.environ['PYTHONUNBUFFERED'])"
    outcome = run(py(code), tmp_path, logs)
    assert outcome.state == "succeeded"
    assert logs.text("stdout") == "'' 1\n"


def test_no_shell_is_involved(tmp_path: Path) -> None:
    logs = Logs()
    outcome = run(command_spec("echo", "$HOME", "a;b", "*"), tmp_path, logs)
    assert outcome.state == "succeeded"
    assert logs.text("stdout") == "$HOME a;b *\n"


@pytest.mark.parametrize("name", ["python", "python3"])
def test_leading_python_is_the_workers_interpreter(tmp_path: Path, name: str) -> None:
    wrapper = tmp_path / "worker-python"
    wrapper.write_text(f'#!/bin/sh\nWRAPPED_BY=worker exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    logs = Logs()
    spec = command_spec(name, "-c", "import os; print(os.environ.get('WRAPPED_BY'))")
    outcome = run(spec, tmp_path, logs, python=str(wrapper))
    assert outcome.state == "succeeded"
    assert logs.text("stdout") == "worker\n"


def test_missing_program_fails_setup(tmp_path: Path) -> None:
    outcome = run(command_spec("no-such-program-here"), tmp_path)
    assert (outcome.state, outcome.reason, outcome.exit_code) == ("failed", "setup_failed", None)
    assert "no-such-program-here" in (outcome.message or "")


# --- working directory and bundles ------------------------------------------------------------


def test_runs_in_the_source_dir_without_a_bundle(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "data.txt").write_text("from source")
    logs = Logs()
    code = "import os; print(os.getcwd()); print(open('data.txt').read())"
    outcome = run(py(code), tmp_path, logs, source_dir=source)
    assert outcome.state == "succeeded"
    assert logs.text("stdout") == f"{source}\nfrom source\n"


def test_bundle_is_unpacked_as_the_working_directory(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "__init__.py").write_text("VALUE = 'from the bundle'\n")
    (source / "train.py").write_text("import os, pkg\nprint(os.getcwd())\nprint(pkg.VALUE)\n")
    bundle = create_bundle(source, tmp_path / "bundle.tar.gz").path
    (source / "train.py").unlink()  # the job must run from the bundle, not from here
    logs = Logs()
    outcome = run(command_spec("python", "train.py"), tmp_path, logs, bundle=bundle)
    assert outcome.state == "succeeded", logs.all_text()
    assert logs.text("stdout") == f"{tmp_path / 'attempt' / 'work'}\nfrom the bundle\n"


def test_broken_bundle_fails_setup(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle.tar.gz"
    bundle.write_bytes(b"not a tar file")
    marker = tmp_path / "ran"
    outcome = run(py(f"open({str(marker)!r}, 'w')"), tmp_path, bundle=bundle)
    assert (outcome.state, outcome.reason) == ("failed", "setup_failed")
    assert not marker.exists()


# --- environment ------------------------------------------------------------------------------


def test_environment_layers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FROM_WORKER", "worker")
    monkeypatch.setenv("OVERRIDDEN", "worker")
    monkeypatch.setenv("GPULAYER_TOKEN", "worker-token")
    monkeypatch.setenv("RANK", "5")
    names = [
        "FROM_WORKER",
        "OVERRIDDEN",
        "FROM_JOB",
        "API_KEY",
        "GPULAYER_JOB_ID",
        "GPULAYER_ATTEMPT",
        "GPULAYER_INPUT_DIR",
        "GPULAYER_OUTPUT_DIR",
        "CUDA_VISIBLE_DEVICES",
        "GPULAYER_TOKEN",
        "RANK",
    ]
    # Reversed, since the secret itself would be masked in the log.
    code = (
        "import json, os\n"
        f"seen = {{n: os.environ.get(n) for n in {names!r}}}\n"
        "seen['API_KEY'] = seen['API_KEY'][::-1]\n"
        "print(json.dumps(seen))\n"
    )
    spec = py(
        code,
        env={"FROM_JOB": "job", "OVERRIDDEN": "job"},
        secrets=[{"name": "API_KEY", "key": "WORKER_API_KEY"}],
    )
    logs = Logs()
    outcome = run(
        spec,
        tmp_path,
        logs,
        job_id="job-42",
        attempt=3,
        extra_env={"CUDA_VISIBLE_DEVICES": "1,3"},
        # The worker's environment is where the job starts from and secrets are read from.
        worker_env={**os.environ, "WORKER_API_KEY": "k-123"},
    )
    assert outcome.state == "succeeded", logs.all_text()
    seen = json.loads(logs.text("stdout"))
    attempt_dir = tmp_path / "attempt"
    assert seen == {
        "FROM_WORKER": "worker",
        "OVERRIDDEN": "job",
        "FROM_JOB": "job",
        "API_KEY": "321-k",
        "GPULAYER_JOB_ID": "job-42",
        "GPULAYER_ATTEMPT": "3",
        "GPULAYER_INPUT_DIR": str(attempt_dir / "input"),
        "GPULAYER_OUTPUT_DIR": str(attempt_dir / "output"),
        "CUDA_VISIBLE_DEVICES": "1,3",
        "GPULAYER_TOKEN": None,  # the worker's own settings stay with the worker
        "RANK": None,
    }


def test_output_dir_exists_and_keeps_what_the_job_writes(tmp_path: Path) -> None:
    code = (
        "import os, pathlib\n"
        "out = pathlib.Path(os.environ['GPULAYER_OUTPUT_DIR'])\n"
        "assert out.is_dir()\n"
        "(out / 'model.bin').write_text('weights')\n"
    )
    outcome = run(py(code), tmp_path)
    assert outcome.state == "succeeded"
    assert (outcome.output_dir / "model.bin").read_text() == "weights"


# --- secrets ----------------------------------------------------------------------------------


def test_missing_secret_fails_before_anything_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    spec = py(f"open({str(marker)!r}, 'w')", secrets=[{"name": "HF_TOKEN"}])
    logs = Logs()
    outcome = run(spec, tmp_path, logs, worker_env={"OTHER": "x"})
    assert (outcome.state, outcome.reason, outcome.exit_code) == ("failed", "secret_missing", None)
    assert outcome.message == "secret HF_TOKEN: key HF_TOKEN is not set on the worker"
    assert not marker.exists()
    assert logs.text("system") == outcome.message + "\n"


def test_secret_read_by_its_key(tmp_path: Path) -> None:
    spec = py(
        "import os; print(len(os.environ['DB_PASSWORD']))",
        secrets=[{"name": "DB_PASSWORD", "key": "PROD_DB_PASSWORD"}],
    )
    logs = Logs()
    outcome = run(spec, tmp_path, logs, worker_env={"PROD_DB_PASSWORD": "hunter2-xyz"})
    assert outcome.state == "succeeded"
    assert logs.text("stdout") == f"{len('hunter2-xyz')}\n"


def test_secret_values_never_reach_logs_or_messages(tmp_path: Path) -> None:
    secret = "sk-live-4f9a2c7e"
    answer = tmp_path / "answer"
    code = (
        "import os, sys\n"
        "v = os.environ['TOKEN']\n"
        "print('token is', v)\n"
        "print('on stderr', v, file=sys.stderr)\n"
        # Written in two pieces around a pause: the partial flush must not show the start.
        "sys.stdout.write('half ' + v[:6]); sys.stdout.flush()\n"
        + wait_for_file(answer)
        + "print(v[6:] + ' end')\n"
        "sys.exit('failed with ' + v)\n"
    )
    logs = Logs()
    logs.on("half", answer.touch)
    spec = py(code, secrets=[{"name": "TOKEN", "key": "WORKER_TOKEN"}])
    outcome = run(spec, tmp_path, logs, worker_env={"WORKER_TOKEN": secret})
    everything = logs.all_text() + repr(outcome)
    assert outcome.state == "failed"
    assert secret not in everything
    assert secret[:6] not in everything
    assert "token is ***\n" in logs.text("stdout")
    assert "half *** end\n" in logs.text("stdout")
    assert "on stderr ***\n" in logs.text("stderr")


# --- inputs -----------------------------------------------------------------------------------


def test_inputs_are_staged_before_the_job_runs(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "config.yaml").write_text("lr: 0.1\n")
    dataset = tmp_path / "dataset"
    (dataset / "train").mkdir(parents=True)
    (dataset / "train" / "part-0").write_text("rows")
    previous = tmp_path / "previous-job-output" / "model.bin"
    previous.parent.mkdir()
    previous.write_text("weights")
    asked: list[str] = []

    def resolve(ref: str) -> Path:
        asked.append(ref)
        return previous

    code = (
        "import os, pathlib\n"
        "root = pathlib.Path(os.environ['GPULAYER_INPUT_DIR'])\n"
        "print(sorted(str(p.relative_to(root)) for p in root.rglob('*') if p.is_file()))\n"
        "print((root / 'conf/config.yaml').read_text().strip())\n"
        "print((root / 'data/train/part-0').read_text())\n"
        "print((root / 'model.bin').read_text())\n"
    )
    spec = py(
        code,
        inputs=[
            {"artifact": "config.yaml", "path": "conf/config.yaml"},
            {"artifact": str(dataset), "path": "data"},
            {"artifact": "job:abc123/model.bin", "path": "model.bin"},
        ],
    )
    logs = Logs()
    # The local control plane's own worker: it runs as the user whose paths these are.
    outcome = run(
        spec, tmp_path, logs, source_dir=source, resolve_artifact=resolve, machine_paths=True
    )
    assert outcome.state == "succeeded", logs.all_text()
    files = ["conf/config.yaml", "data/train/part-0", "model.bin"]
    assert logs.text("stdout") == f"{files}\nlr: 0.1\nrows\nweights\n"
    assert asked == ["job:abc123/model.bin"]


def test_an_input_out_of_reach_with_the_control_plane_passes_the_error_on(
    tmp_path: Path,
) -> None:
    # Its worker reports the attempt lost (retryable), rather than a setup failure.
    marker = tmp_path / "ran"
    spec = py(
        f"open({str(marker)!r}, 'w')",
        inputs=[{"artifact": "job:abc123/model.bin", "path": "model.bin"}],
    )

    def resolve(reference: str) -> Path:
        raise ControlPlaneError("control plane at http://127.0.0.1:1 broke off its answer")

    with pytest.raises(ControlPlaneError, match="broke off"):
        run(spec, tmp_path, resolve_artifact=resolve)
    assert not marker.exists()


def test_missing_input_fails_before_anything_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    spec = py(
        f"open({str(marker)!r}, 'w')",
        inputs=[{"artifact": str(tmp_path / "nowhere.csv"), "path": "data.csv"}],
    )
    outcome = run(spec, tmp_path, machine_paths=True)
    assert (outcome.state, outcome.reason) == ("failed", "input_missing")
    assert "inputs[0]" in (outcome.message or "") and "nowhere.csv" in (outcome.message or "")
    assert not marker.exists()


def test_a_cloud_input_the_worker_cannot_read_fails_before_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # gpulayer-gcp fetches gs:// here; with no Google credentials and no emulator the fetch
    # fails and the job never starts, its message naming the input.
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-such-credentials.json"))
    marker = tmp_path / "ran"
    spec = py(
        f"open({str(marker)!r}, 'w').close()",
        inputs=[{"artifact": "gs://bucket/data.csv", "path": "data.csv"}],
    )
    outcome = run(spec, tmp_path)
    assert outcome.state == "failed"
    assert "inputs[0]" in (outcome.message or "") and "gs://bucket/data.csv" in (
        outcome.message or ""
    )
    assert not marker.exists()


# --- ending the process tree ------------------------------------------------------------------

_FORKS = "sleep 100 & echo pid $!; sleep 100 & echo pid $!; echo pid $$; echo ready; wait"


def test_timeout_ends_the_job_and_its_grandchildren(tmp_path: Path) -> None:
    logs = Logs()
    spec = command_spec("sh", "-c", _FORKS, timeout_seconds=1)
    outcome = run(spec, tmp_path, logs)
    assert (outcome.state, outcome.reason) == ("failed", "timeout")
    assert outcome.message == "timed out after 1 s"
    pids = printed_pids(logs)
    assert len(pids) == 3
    assert all(gone(pid) for pid in pids)


def test_cancel_from_another_thread_ends_the_tree(tmp_path: Path) -> None:
    logs = Logs()
    context = RunContext("job-1", 1, command_spec("sh", "-c", _FORKS), tmp_path / "attempt")
    job = JobRun(context, logs)
    logs.on("ready", lambda: threading.Thread(target=job.cancel).start())
    outcome = job.run()
    assert (outcome.state, outcome.reason) == ("cancelled", "cancelled")
    pids = printed_pids(logs)
    assert len(pids) == 3
    assert all(gone(pid) for pid in pids)


def test_processes_that_ignore_sigterm_are_killed(tmp_path: Path) -> None:
    logs = Logs()
    # An ignored signal stays ignored across fork and exec, so the sleeps ignore it too.
    spec = command_spec("sh", "-c", "trap '' TERM; " + _FORKS, timeout_seconds=1, grace_seconds=0.2)
    outcome = run(spec, tmp_path, logs)
    assert (outcome.state, outcome.reason) == ("failed", "timeout")
    assert outcome.exit_code == -9
    pids = printed_pids(logs)
    assert len(pids) == 3
    assert all(gone(pid) for pid in pids)
    assert "SIGTERM, then SIGKILL after 0.2 s" in logs.text("system")


# On SIGTERM the job saves its state and then ends, as a training loop saves a checkpoint.
_SAVES_ON_SIGTERM = (
    "import os, signal, sys, time\n"
    "def save(*_):\n"
    "    time.sleep(0.5)\n"
    "    out = os.environ['GPULAYER_OUTPUT_DIR']\n"
    "    open(os.path.join(out, 'saved.txt'), 'w').write('last state')\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, save)\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)


def test_a_cancelled_job_gets_its_grace_to_save_its_state(tmp_path: Path) -> None:
    logs = Logs()
    context = RunContext("job-1", 1, py(_SAVES_ON_SIGTERM), tmp_path / "attempt")
    job = JobRun(context, logs)
    logs.on("ready", lambda: threading.Thread(target=job.cancel).start())
    outcome = job.run()
    assert (outcome.state, outcome.reason) == ("cancelled", "cancelled")
    assert (outcome.output_dir / "saved.txt").read_text() == "last state"
    assert "cancelled; stopping the job (SIGTERM, then SIGKILL after 30 s)" in logs.text("system")


def test_a_timed_out_job_gets_its_grace_to_save_its_state(tmp_path: Path) -> None:
    outcome = run(py(_SAVES_ON_SIGTERM, timeout_seconds=1, grace_seconds=20), tmp_path)
    assert (outcome.state, outcome.reason) == ("failed", "timeout")
    assert (outcome.output_dir / "saved.txt").read_text() == "last state"


def test_a_job_still_running_after_its_grace_is_killed(tmp_path: Path) -> None:
    logs = Logs()
    # It ignores SIGTERM: once its 0.5 s of grace are over, SIGKILL ends it.
    code = (
        "import os, signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print(f'pid {os.getpid()}', flush=True)\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    context = RunContext("job-1", 1, py(code, grace_seconds=0.5), tmp_path / "attempt")
    job = JobRun(context, logs)
    logs.on("ready", lambda: threading.Thread(target=job.cancel).start())
    outcome = job.run()
    assert (outcome.state, outcome.exit_code) == ("cancelled", -9)
    assert all(gone(pid) for pid in printed_pids(logs))


def test_background_processes_left_after_a_normal_exit_are_ended(tmp_path: Path) -> None:
    logs = Logs()
    outcome = run(command_spec("sh", "-c", "sleep 100 & echo pid $!"), tmp_path, logs)
    assert outcome.state == "succeeded"
    [pid] = printed_pids(logs)
    assert gone(pid)
    assert "ended 1 process(es) the job left running" in logs.text("system")


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="descendants are followed through /proc")
def test_a_child_in_a_session_of_its_own_is_ended_too(tmp_path: Path) -> None:
    logs = Logs()
    code = (
        "import subprocess, time\n"
        "p = subprocess.Popen(['sleep', '100'], start_new_session=True)\n"
        "print('pid', p.pid); print('ready')\n"
        "time.sleep(100)\n"
    )
    context = RunContext("job-1", 1, py(code), tmp_path / "attempt")
    job = JobRun(context, logs)
    logs.on("ready", job.cancel)
    outcome = job.run()
    assert outcome.state == "cancelled"
    [pid] = printed_pids(logs)
    assert gone(pid)


def test_cancel_before_run_starts_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    context = RunContext("job-1", 1, py(f"open({str(marker)!r}, 'w')"), tmp_path / "attempt")
    job = JobRun(context, Logs())
    job.cancel()
    outcome = job.run()
    assert (outcome.state, outcome.reason, outcome.exit_code) == ("cancelled", "cancelled", None)
    assert not marker.exists()


def test_a_run_is_not_repeated(tmp_path: Path) -> None:
    job = JobRun(RunContext("job-1", 1, py("pass"), tmp_path / "attempt"), Logs())
    assert job.run().state == "succeeded"
    with pytest.raises(RuntimeError, match="runs once"):
        job.run()
