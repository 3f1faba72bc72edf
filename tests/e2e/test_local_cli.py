"""Local jobs through the real command line: submit, stream, states, logs, cancel, artifacts."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import run_cli
from tests.support.daemon import pid_alive


def job_json(job_ref: str) -> dict[str, Any]:
    result = run_cli(["status", job_ref, "--json"])
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def wait_for_state(job_id: str, states: set[str], timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = job_json(job_id)
        if job["state"] in states:
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} never reached {states}: {job}")


def wait_for_file(path: Path, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.1)
    raise AssertionError(f"{path} never appeared")


def test_submit_streams_output_and_exits_with_job_code(tmp_path: Path) -> None:
    script = "import sys; print('to stdout'); print('to stderr', file=sys.stderr); sys.exit(7)"
    result = run_cli(["submit", "--", "python", "-c", script], cwd=tmp_path)
    assert result.returncode == 7
    assert "to stdout" in result.stdout
    assert "to stderr" in result.stderr
    assert "to stderr" not in result.stdout


def test_success_runs_in_submit_directory_with_job_env(tmp_path: Path) -> None:
    script = (
        "import os; print(os.getcwd()); "
        "print(os.environ['GPULAYER_JOB_ID']); print(os.environ['EPOCHS']); "
        "print(os.path.isdir(os.environ['GPULAYER_INPUT_DIR'])); "
        "print(os.path.isdir(os.environ['GPULAYER_OUTPUT_DIR']))"
    )
    result = run_cli(["submit", "--env", "EPOCHS=10", "--", "python", "-c", script], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    cwd, job_id, epochs, has_input, has_output = result.stdout.split()
    assert Path(cwd).resolve() == tmp_path.resolve()
    assert job_id.startswith("j-")
    assert epochs == "10" and has_input == "True" and has_output == "True"
    assert job_json(job_id)["state"] == "succeeded"


def test_python_means_the_workers_interpreter(tmp_path: Path) -> None:
    result = run_cli(
        ["submit", "--", "python", "-c", "import sys; print(sys.executable)"], cwd=tmp_path
    )
    assert result.returncode == 0
    assert Path(result.stdout.strip()).resolve() == Path(sys.executable).resolve()


def test_command_is_not_run_through_a_shell(tmp_path: Path) -> None:
    result = run_cli(["submit", "--", "echo", "$HOME", "&&", "false"], cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout.strip() == "$HOME && false"


def test_detached_job_finishes_and_is_recorded(tmp_path: Path) -> None:
    marker = tmp_path / "done.txt"
    script = (
        f"import time; time.sleep(1.5); open({str(marker)!r}, 'w').write('ok'); print('finished')"
    )
    started = time.monotonic()
    result = run_cli(
        ["submit", "-d", "--name", "detached", "--", "python", "-c", script], cwd=tmp_path
    )
    assert result.returncode == 0
    job_id = result.stdout.strip()
    assert job_id.startswith("j-") and "\n" not in job_id
    assert (
        time.monotonic() - started < 10
    )  # returned without waiting for the job's 1.5 s ... and more
    job = wait_for_state(job_id, {"succeeded", "failed"})
    assert job["state"] == "succeeded" and job["name"] == "detached"
    assert marker.read_text() == "ok"
    for key in (
        "id",
        "name",
        "state",
        "reason",
        "exit_code",
        "result",
        "attempts",
        "created_at",
        "started_at",
        "finished_at",
    ):
        assert key in job
    assert job["attempts"][0]["worker_id"] == "local"
    logs = run_cli(["logs", job_id])
    assert "finished" in logs.stdout


def test_ls_and_logs_json(tmp_path: Path) -> None:
    result = run_cli(
        [
            "submit",
            "--name",
            "listed",
            "--label",
            "team=nlp",
            "--",
            "python",
            "-c",
            "print('line one'); print('line two')",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 0
    listed = json.loads(run_cli(["ls", "--json"]).stdout)
    mine = [j for j in listed if j["name"] == "listed"]
    assert mine and mine[0]["state"] == "succeeded" and mine[0]["labels"] == {"team": "nlp"}
    lines = json.loads(run_cli(["logs", mine[0]["id"], "--json"]).stdout)
    stdout = [line["text"].rstrip("\n") for line in lines if line["stream"] == "stdout"]
    assert stdout == ["line one", "line two"]
    table = run_cli(["ls"])
    assert mine[0]["id"] in table.stdout


def test_logs_timestamps_prefix_each_line_in_order(tmp_path: Path) -> None:
    import re
    from datetime import datetime

    script = "import time; print('first', flush=True); time.sleep(0.2); print('second')"
    submitted = run_cli(["submit", "-d", "--", "python", "-c", script], cwd=tmp_path)
    job_id = submitted.stdout.strip()
    wait_for_state(job_id, {"succeeded"})
    plain = run_cli(["logs", job_id])
    assert plain.stdout.splitlines() == ["first", "second"]
    stamped = run_cli(["logs", job_id, "--timestamps"])
    assert stamped.returncode == 0, stamped.stderr
    pattern = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00) (.*)$")
    matches = [pattern.match(line) for line in stamped.stdout.splitlines()]
    assert all(matches), stamped.stdout
    assert [m.group(2) for m in matches if m] == ["first", "second"]
    times = [datetime.fromisoformat(m.group(1)) for m in matches if m]
    assert times == sorted(times)
    # gpulayer's own notes on stderr carry the stamp first, then their prefix.
    notes = [line for line in stamped.stderr.splitlines() if "gpulayer: " in line]
    assert notes and all(pattern.match(line) for line in notes)


def test_logs_follow_streams_a_running_job(tmp_path: Path) -> None:
    script = "import time\nfor i in range(3):\n    print('tick', i, flush=True); time.sleep(0.3)"
    job_id = run_cli(["submit", "-d", "--", "python", "-c", script], cwd=tmp_path).stdout.strip()
    followed = run_cli(["logs", job_id, "-f"])
    assert followed.returncode == 0
    assert [line for line in followed.stdout.splitlines() if line.startswith("tick")] == [
        "tick 0",
        "tick 1",
        "tick 2",
    ]


def test_cancel_ends_the_whole_process_tree(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = f"sleep 300 & echo $$ $! > {pids}; wait"
    job_id = run_cli(["submit", "-d", "--", "sh", "-c", script], cwd=tmp_path).stdout.strip()
    shell_pid, child_pid = (int(p) for p in wait_for_file(pids).split())
    cancelled = run_cli(["cancel", job_id, "--json"])
    assert cancelled.returncode == 0
    job = wait_for_state(job_id, {"cancelled", "failed", "succeeded"})
    assert job["state"] == "cancelled" and job["reason"] == "cancelled"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (pid_alive(shell_pid) or pid_alive(child_pid)):
        time.sleep(0.1)
    assert not pid_alive(shell_pid) and not pid_alive(child_pid)


def test_cancel_of_a_queued_job_is_immediate() -> None:
    # Nothing here has a 'pool=none' label, and remote queues by default: the job waits.
    submitted = run_cli(["submit", "-d", "--target", "remote", "--", "true"])
    job_id = submitted.stdout.strip()
    assert job_json(job_id)["state"] == "queued"
    run_cli(["cancel", job_id])
    job = job_json(job_id)
    assert job["state"] == "cancelled" and job["reason"] == "cancelled"


def test_timeout_fails_with_reason_timeout(tmp_path: Path) -> None:
    result = run_cli(["submit", "--timeout", "1", "--", "sleep", "30"], cwd=tmp_path)
    assert result.returncode != 0
    listed = json.loads(run_cli(["ls", "--json", "-n", "1"]).stdout)
    assert listed[0]["state"] == "failed" and listed[0]["reason"] == "timeout"


def _newest_job_id() -> str | None:
    listed = json.loads(run_cli(["ls", "--json", "-n", "1"]).stdout)
    return listed[0]["id"] if listed else None


def test_unrunnable_local_job_is_refused_at_submit_with_reasons(tmp_path: Path) -> None:
    before = _newest_job_id()
    started = time.monotonic()
    result = run_cli(["submit", "--accelerator", "cuda", "--gpus", "2", "--", "true"], cwd=tmp_path)
    assert time.monotonic() - started < 15
    assert result.returncode == 2, result.stderr
    assert "placement: unschedulable" in result.stderr and "cuda" in result.stderr
    assert "Traceback" not in result.stderr
    assert _newest_job_id() == before  # no job was created


def test_on_unschedulable_fail_is_refused_at_submit(tmp_path: Path) -> None:
    spec: dict[str, Any] = {"workload": {"kind": "command", "command": ["true"]}}
    spec["placement"] = {"target": "remote", "on_unschedulable": "fail"}
    (tmp_path / "job.json").write_text(json.dumps(spec))
    before = _newest_job_id()
    result = run_cli(["submit", "-d", "-f", "job.json"], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "placement: unschedulable" in result.stderr and "Traceback" not in result.stderr
    assert "no remote worker is registered" in result.stderr
    assert "hint: start one with `gpulayer worker start" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert _newest_job_id() == before


def test_a_missing_local_input_is_refused_at_submit(tmp_path: Path) -> None:
    before = _newest_job_id()
    result = run_cli(
        ["submit", "-d", "--input", "data/absent.csv:train.csv", "--", "true"], cwd=tmp_path
    )
    assert result.returncode == 2, result.stderr
    assert "inputs[0].artifact" in result.stderr and "absent.csv" in result.stderr
    assert "does not exist" in result.stderr
    assert _newest_job_id() == before
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "absent.csv").write_text("a,b\n")
    present = run_cli(
        ["submit", "--input", "data/absent.csv:train.csv", "--", "true"], cwd=tmp_path
    )
    assert present.returncode == 0, present.stderr


def test_remote_on_the_local_control_plane_waits_with_a_hint(tmp_path: Path) -> None:
    result = run_cli(["submit", "-d", "--target", "remote", "--", "true"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "no remote worker is registered" in result.stderr
    assert "gpulayer worker start" in result.stderr
    job_id = result.stdout.strip()
    assert job_json(job_id)["state"] == "queued"
    logs = run_cli(["logs", job_id])
    assert (
        logs.stdout.count("hint: no remote worker") + logs.stderr.count("hint: no remote worker")
        == 1
    )
    run_cli(["cancel", job_id])


def test_a_skipped_target_is_named_in_status_and_log(tmp_path: Path) -> None:
    result = run_cli(
        ["submit", "--target", "remote", "--fallback", "local", "--", "true"], cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    job_id = _newest_job_id()
    assert job_id is not None
    job = job_json(job_id)
    assert job["target"] == "local" and job["state"] == "succeeded"
    assert "target remote skipped: no remote worker is registered" in job["message"]
    shown = run_cli(["status", job_id])
    assert "target remote skipped" in shown.stdout
    logs = run_cli(["logs", job_id])
    assert "target remote skipped" in logs.stdout + logs.stderr


def test_unrunnable_local_job_goes_to_the_fallback_target(tmp_path: Path) -> None:
    result = run_cli(
        ["submit", "-d", "--accelerator", "cuda", "--fallback", "remote", "--", "true"],
        cwd=tmp_path,
    )
    assert result.returncode == 0
    job = job_json(result.stdout.strip())
    assert job["state"] == "queued" and job["target"] == "remote"
    run_cli(["cancel", job["id"]])


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--env", "NOEQUALS", "--", "true"], "--env: expected KEY=VALUE"),
        (["--input", "nocolon", "--", "true"], "--input: expected ARTIFACT:PATH"),
        (["--secret", "=X", "--", "true"], "--secret:"),
        (["--target", "moon", "--", "true"], "--target:"),
        (["--env", "RANK=1", "--", "true"], "error: --env: "),
        (["--profile", "tf", "--", "true"], "error: --profile: "),
        (["--name", "bad name", "--", "true"], "error: --name: "),
        ([], "ARGV: give a command"),
        (["--gpus", "two", "--", "true"], "error: Invalid value for '--gpus'"),
    ],
)
def test_bad_submit_input_is_one_line_exit_2(args: list[str], expected: str) -> None:
    before = json.loads(run_cli(["ls", "--json", "-n", "1000"]).stdout)
    result = run_cli(["submit", *args])
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    after = json.loads(run_cli(["ls", "--json", "-n", "1000"]).stdout)
    assert len(after) == len(before)  # nothing half-created


def test_unknown_job_is_a_clear_error() -> None:
    result = run_cli(["status", "j-doesnotexist"])
    assert result.returncode == 2
    assert "not found" in result.stderr and "Traceback" not in result.stderr


def test_secret_is_resolved_on_the_worker_and_never_stored(
    tmp_path: Path, shared_home: Path
) -> None:
    value = "s3cr3t-value-9f8e7d"
    script = "import os; v = os.environ['API_TOKEN']; print('length', len(v)); print(v[:2] == 's3')"
    result = run_cli(
        ["submit", "--secret", "API_TOKEN=MY_API_TOKEN", "--", "python", "-c", script],
        env={"MY_API_TOKEN": value},
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert f"length {len(value)}" in result.stdout
    assert value not in result.stdout + result.stderr
    database = shared_home / "state.db"
    with sqlite3.connect(database) as conn:
        for table in ("jobs", "logs", "attempts"):
            rows = conn.execute(f"SELECT * FROM {table}").fetchall()
            assert value not in repr(rows)
    for path in shared_home.rglob("*"):
        if path.is_file() and path.stat().st_size < 5_000_000:
            assert value.encode() not in path.read_bytes(), path


def test_missing_secret_fails_before_running_naming_the_key(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    result = run_cli(
        ["submit", "--secret", "API_TOKEN=NOT_SET_ANYWHERE", "--", "touch", str(marker)],
        cwd=tmp_path,
    )
    assert result.returncode == 1
    assert "NOT_SET_ANYWHERE" in result.stderr
    assert not marker.exists()
    job = json.loads(run_cli(["ls", "--json", "-n", "1"]).stdout)[0]
    assert job["state"] == "failed" and job["reason"] == "secret_missing"


def test_inputs_outputs_and_job_references(tmp_path: Path) -> None:
    data = tmp_path / "data.csv"
    data.write_text("a,b\n1,2\n")
    writer = (
        "import os, pathlib; src = pathlib.Path(os.environ['GPULAYER_INPUT_DIR'], 'in/data.csv'); "
        "out = pathlib.Path(os.environ['GPULAYER_OUTPUT_DIR']); (out / 'sub').mkdir(); "
        "(out / 'sub' / 'model.txt').write_text(src.read_text().upper())"
    )
    first = run_cli(
        ["submit", "--input", "data.csv:in/data.csv", "--", "python", "-c", writer], cwd=tmp_path
    )
    assert first.returncode == 0, first.stderr
    first_id = json.loads(run_cli(["ls", "--json", "-n", "1"]).stdout)[0]["id"]
    listed = json.loads(run_cli(["artifacts", first_id, "--json"]).stdout)
    assert [entry["path"] for entry in listed] == ["sub/model.txt"]
    assert listed[0]["size"] == len("A,B\n1,2\n")

    download = tmp_path / "download"
    fetched = run_cli(["artifacts", first_id, "--download", str(download)])
    assert fetched.returncode == 0
    assert (download / "sub" / "model.txt").read_text() == "A,B\n1,2\n"

    reader = "import os, pathlib; print(pathlib.Path(os.environ['GPULAYER_INPUT_DIR'], 'prev.txt').read_text())"
    second = run_cli(
        [
            "submit",
            "--input",
            f"job:{first_id}/sub/model.txt:prev.txt",
            "--",
            "python",
            "-c",
            reader,
        ],
        cwd=tmp_path,
    )
    assert second.returncode == 0, second.stderr
    assert "A,B" in second.stdout


def test_function_job_from_a_file_returns_its_result(tmp_path: Path) -> None:
    source = tmp_path / "project"
    source.mkdir()
    (source / "tasks.py").write_text(
        "import os\n"
        "def add(a, b, scale=1):\n"
        "    print('in', os.path.basename(os.getcwd()))\n"
        "    return {'sum': (a + b) * scale}\n"
        "def boom():\n"
        "    raise ValueError('bad things')\n"
    )
    (tmp_path / "job.yaml").write_text(
        "name: adder\nworkload:\n  kind: function\n  entrypoint: tasks:add\n  args: [2, 3]\n"
        "  kwargs: {scale: 10}\n  source: project\n"
    )
    result = run_cli(["submit", "-f", "job.yaml"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    job = json.loads(run_cli(["ls", "--json", "-n", "1"]).stdout)[0]
    assert job["result"] == {"sum": 50}
    assert "in work" in result.stdout  # ran in the unpacked bundle, not in the project folder

    (tmp_path / "boom.json").write_text(
        json.dumps(
            {"workload": {"kind": "function", "entrypoint": "tasks:boom", "source": "project"}}
        )
    )
    failed = run_cli(["submit", "-f", "boom.json"], cwd=tmp_path)
    assert failed.returncode == 1
    assert "ValueError: bad things" in failed.stderr
    assert "Traceback" in failed.stderr  # the job's own traceback, in its logs
    job = json.loads(run_cli(["ls", "--json", "-n", "1"]).stdout)[0]
    assert job["state"] == "failed" and job["reason"] == "function_error"


def test_flags_override_the_files_fields(tmp_path: Path) -> None:
    (tmp_path / "job.json").write_text(
        json.dumps(
            {
                "name": "from-file",
                "workload": {
                    "kind": "command",
                    "command": ["python", "-c", "import os; print(os.environ['MODE'])"],
                },
                "env": {"MODE": "file"},
            }
        )
    )
    result = run_cli(
        ["submit", "-f", "job.json", "--name", "from-flag", "--env", "MODE=flag"], cwd=tmp_path
    )
    assert result.returncode == 0
    assert result.stdout.strip() == "flag"
    job = json.loads(run_cli(["ls", "--json", "-n", "1"]).stdout)[0]
    assert job["name"] == "from-flag"


def test_ctrl_c_cancels_the_job_cleanly(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); print('started', flush=True); time.sleep(300)"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpulayer",
            "submit",
            "--name",
            "interrupted",
            "--",
            "python",
            "-c",
            script,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=dict(os.environ),
    )
    job_pid = int(wait_for_file(pid_file))
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    job = json.loads(run_cli(["ls", "--json", "-n", "1"]).stdout)[0]
    assert job["name"] == "interrupted"
    assert job["state"] == "cancelled" and job["reason"] == "cancelled"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and pid_alive(job_pid):
        time.sleep(0.1)
    assert not pid_alive(job_pid)


def test_concurrent_submits_are_all_recorded(tmp_path: Path) -> None:
    before = len(json.loads(run_cli(["ls", "--json", "-n", "10000"]).stdout))
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpulayer",
                "submit",
                "--name",
                f"many-{i}",
                "--",
                "python",
                "-c",
                f"print({i})",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        for i in range(6)
    ]
    outputs = [p.communicate(timeout=120) for p in processes]
    assert all(p.returncode == 0 for p in processes), outputs
    assert sorted(int(out.strip()) for out, _ in outputs) == list(range(6))
    after = json.loads(run_cli(["ls", "--json", "-n", "10000"]).stdout)
    assert len(after) == before + 6
    assert {j["name"] for j in after if j["name"].startswith("many-")} == {
        f"many-{i}" for i in range(6)
    }


def test_workers_lists_the_probed_local_machine() -> None:
    workers = json.loads(run_cli(["workers", "--json"]).stdout)
    local = [w for w in workers if w["kind"] == "local"]
    assert len(local) == 1
    caps = local[0]["capabilities"]
    assert caps["cpu_cores"] == len(os.sched_getaffinity(0))
    assert caps["python_version"] == ".".join(str(v) for v in sys.version_info[:3])
    assert "pydantic" in caps["frameworks"]
    table = run_cli(["workers"])
    assert "local" in table.stdout


def test_local_job_starts_from_the_submitting_shells_environment(tmp_path: Path) -> None:
    run_cli(["submit", "--", "true"], cwd=tmp_path)  # the control plane is already up
    script = "import os; print(os.environ.get('ONLY_IN_THIS_SHELL'))"
    result = run_cli(
        ["submit", "--", "python", "-c", script], env={"ONLY_IN_THIS_SHELL": "yes"}, cwd=tmp_path
    )
    assert result.returncode == 0
    assert result.stdout.strip() == "yes"


def test_logs_of_a_node_the_job_does_not_have_is_a_usage_error(tmp_path: Path) -> None:
    # Two nodes, target remote: nothing here serves it, so it waits queued with its two nodes.
    spec = tmp_path / "gang.yaml"
    spec.write_text(
        "workload: {kind: distributed, entrypoint: train.py, num_workers: 2}\n"
        "placement: {target: remote}\n"
    )
    (tmp_path / "train.py").write_text("print('rank')\n")
    submitted = run_cli(["submit", "-d", "-f", str(spec)], cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    try:
        past = run_cli(["logs", job_id, "--node", "5"])
        assert past.returncode == 2, (past.stdout, past.stderr)
        assert past.stderr.count("\n") == 1 and "Traceback" not in past.stderr
        assert "--node" in past.stderr and "2 nodes" in past.stderr and job_id in past.stderr
        last = run_cli(["logs", job_id, "--node", "1"])
        assert last.returncode == 0, last.stderr
    finally:
        run_cli(["cancel", job_id])
    single = run_cli(["submit", "--", "python", "-c", "print('only node')"], cwd=tmp_path)
    assert single.returncode == 0, single.stderr
    only = json.loads(run_cli(["ls", "--json", "-n", "1"]).stdout)[0]["id"]
    assert "only node" in run_cli(["logs", only, "--node", "0"]).stdout
    refused = run_cli(["logs", only, "--node", "1"])
    assert refused.returncode == 2 and "--node" in refused.stderr and "1 node" in refused.stderr


def _listed(*args: str) -> list[dict[str, Any]]:
    result = run_cli(["ls", "--json", "-n", "1000", *args])
    assert result.returncode == 0, result.stderr
    jobs: list[dict[str, Any]] = json.loads(result.stdout)
    return jobs


def test_ls_filters_by_label_schedule_and_state(tmp_path: Path) -> None:
    def submit(*args: str) -> str:
        done = run_cli(["submit", *args], cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    submit("--label", "suite=ls", "--label", "team=a", "--", "true")
    submit("--label", "suite=ls", "--label", "team=b", "--", "true")
    queued = submit(
        "-d", "--target", "remote", "--label", "suite=ls", "--label", "team=a", "--", "true"
    )
    schedule = tmp_path / "sched.yaml"
    schedule.write_text(
        "name: ls-filter\ncron: '0 4 1 1 *'\nsuspend: true\n"
        "job: {workload: {kind: command, command: ['true']}, labels: {suite: ls}}\n"
    )
    assert run_cli(["schedule", "apply", "-f", str(schedule)]).returncode == 0
    triggered = run_cli(["schedule", "trigger", "ls-filter"])
    assert triggered.returncode == 0, triggered.stderr
    run_of_schedule = triggered.stdout.strip()
    try:
        everything = {j["id"] for j in _listed("--label", "suite=ls")}
        assert queued in everything and run_of_schedule in everything and len(everything) == 4
        team_a = _listed("--label", "suite=ls", "--label", "team=a")
        assert len(team_a) == 2 and all(j["labels"]["team"] == "a" for j in team_a)
        waiting = _listed("--label", "suite=ls", "--state", "queued", "--state", "provisioning")
        assert [j["id"] for j in waiting] == [queued]
        assert [j["id"] for j in _listed("--schedule", "ls-filter")] == [run_of_schedule]
        assert _listed("--schedule", "no-such-schedule") == []
        table = run_cli(["ls", "--label", "team=b"])
        assert table.returncode == 0 and queued not in table.stdout
    finally:
        run_cli(["cancel", queued])
        run_cli(["schedule", "delete", "ls-filter"])


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--label", "team"], "--label: expected KEY=VALUE"),
        (["--state", "runing"], "--state: 'runing' is not a job state; did you mean running?"),
        (["--schedule", ""], "--schedule: give a schedule's name"),
    ],
)
def test_ls_bad_filters_are_one_line_exit_2(args: list[str], expected: str) -> None:
    result = run_cli(["ls", *args])
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert expected in result.stderr and result.stderr.count("\n") == 1
