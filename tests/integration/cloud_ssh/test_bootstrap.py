"""bootstrap_worker end to end: a real control plane, a real sshd host, the real script."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest

from gpulayer.cloud.bootstrap import (
    BootstrapError,
    BootstrapPlanError,
    BootstrapTimeout,
    HostIncompatible,
    bootstrap_worker,
    validate_plan,
)
from gpulayer.cloud.images import bootstrap_script
from gpulayer.cloud.wheelhouse import WheelFile, Wheelhouse
from tests.integration.cloud_ssh.helpers import (
    ControlPlane,
    connect,
    eventually,
    make_plan,
    processes_mentioning,
)
from tests.support.servers import wait_for_job
from tests.support.sshd_hosts import SshdHost

pytestmark = pytest.mark.slow


def test_worker_joins_through_the_tunnel_runs_a_job_and_leaves_nothing(
    ssh_host: SshdHost, control_plane: ControlPlane, wheelhouse: Wheelhouse, tmp_path: Path
) -> None:
    install_dir = tmp_path / "gpulayer" / "job-1"
    token = control_plane.worker_token()
    # A remote-kind worker, so a job pinned to it is scheduled by the current control plane.
    plan = make_plan(install_dir, control_plane.port, token, kind="remote", worker_name="w-job")
    output: list[str] = []
    session = connect(ssh_host)
    try:
        worker = bootstrap_worker(session, plan, wheelhouse, output.append, timeout=120)
        try:
            assert worker.worker_id is not None
            assert control_plane.worker(worker.worker_id)["state"] == "ready"
            assert worker.pid in processes_mentioning(ssh_host, str(install_dir / "venv"))
            job = control_plane.client.submit(
                {
                    "workload": {
                        "kind": "command",
                        "command": ["python", "-c", "import sys; print('ran-by', sys.executable)"],
                    },
                    "placement": {"target": "remote", "worker_ids": [worker.worker_id]},
                }
            )
            done = wait_for_job(control_plane.client, job["id"], {"succeeded", "failed"})
            assert done["state"] == "succeeded", done
            lines = [line["text"] for line in control_plane.client.logs(job["id"])["lines"]]
            # The job ran on the bootstrapped worker: with the interpreter of its venv.
            assert any(f"ran-by {install_dir}/venv/bin/python" in line for line in lines), lines
        finally:
            worker.stop()
            worker.cleanup()
    finally:
        session.close()
    assert not ssh_host.exists(install_dir)
    assert processes_mentioning(ssh_host, str(install_dir)) == []
    assert any(line.startswith("gpulayer-bootstrap: installing") for line in output)
    assert any("worker joined" in line for line in output)


def test_cloud_worker_registers_with_its_place_and_price(
    ssh_host: SshdHost, control_plane: ControlPlane, wheelhouse: Wheelhouse, tmp_path: Path
) -> None:
    install_dir = tmp_path / "gpulayer" / "job-2"
    plan = make_plan(install_dir, control_plane.port, control_plane.worker_token())
    session = connect(ssh_host)
    try:
        worker = bootstrap_worker(session, plan, wheelhouse, lambda line: None, timeout=120)
        try:
            assert worker.worker_id is not None
            seen = control_plane.worker(worker.worker_id)
            capabilities = seen["capabilities"]
            assert seen["kind"] == "cloud"
            assert seen["name"] == "cloud-1"
            assert seen["labels"] == {"pool": "test"}
            assert (capabilities["provider"], capabilities["region"], capabilities["zone"]) == (
                "ssh",
                "on-prem",
                "node0",
            )
            assert capabilities["hourly_price"] == 0.25
            # The worker reaches the control plane only through the tunnel on the host.
            assert worker.remote_port == worker.tunnel.remote_port
        finally:
            worker.stop()
            worker.cleanup()
    finally:
        session.close()


def test_token_is_never_in_a_command_line_nor_left_on_disk(
    ssh_host: SshdHost, control_plane: ControlPlane, wheelhouse: Wheelhouse, tmp_path: Path
) -> None:
    install_dir = tmp_path / "gpulayer" / "job-3"
    token = control_plane.worker_token()
    output: list[str] = []
    session = connect(ssh_host)
    try:
        worker = bootstrap_worker(
            session,
            make_plan(install_dir, control_plane.port, token),
            wheelhouse,
            output.append,
            timeout=120,
        )
        try:
            pids = processes_mentioning(ssh_host, str(install_dir))
            assert worker.pid in pids
            for pid in pids:
                assert token.encode() not in ssh_host.read_bytes(f"/proc/{pid}/cmdline")
            # It reached the worker through its environment instead.
            assert f"GPULAYER_TOKEN={token}".encode() in ssh_host.read_bytes(
                f"/proc/{worker.pid}/environ"
            )
            assert ssh_host.exists(install_dir / "venv")
            assert not ssh_host.exists(install_dir / "worker.token")
            assert all(token not in line for line in output)
            log = ssh_host.read_text(install_dir / "worker.log")
            assert log.strip(), "the worker wrote no log"
            assert token not in log
        finally:
            worker.stop()
            worker.cleanup()
    finally:
        session.close()


def _start_launcher(host: SshdHost, install_dir: Path) -> int:
    """What a Slurm step runs on its node: the launcher of the worker handed to install_dir."""
    from gpulayer.cloud import LAUNCH_DIR_VARIABLE, launcher_loop

    started = host.run(
        f"{LAUNCH_DIR_VARIABLE}={shlex.quote(str(install_dir))} setsid sh -c "
        f"{shlex.quote(launcher_loop())} </dev/null >/dev/null 2>&1 & echo $!",
        check=True,
    )
    return int(started.stdout.strip())


def test_a_worker_handed_off_is_started_by_the_machines_own_launcher(
    ssh_host: SshdHost, control_plane: ControlPlane, wheelhouse: Wheelhouse, tmp_path: Path
) -> None:
    install_dir = tmp_path / "gpulayer" / "job-h"
    launcher = _start_launcher(ssh_host, install_dir)
    token = control_plane.worker_token()
    output: list[str] = []
    session = connect(ssh_host)
    try:
        plan = make_plan(install_dir, control_plane.port, token, hand_off=True)
        worker = bootstrap_worker(session, plan, wheelhouse, output.append, timeout=120)
        try:
            assert worker.worker_id is not None
            assert control_plane.worker(worker.worker_id)["state"] == "ready"
            stat = ssh_host.read_text(f"/proc/{worker.pid}/stat")
            assert int(stat.rsplit(")", 1)[1].split()[1]) == launcher  # its parent
            assert any("handing the worker's start" in line for line in output), output
            assert not ssh_host.exists(install_dir / "worker.token")
            for pid in processes_mentioning(ssh_host, str(install_dir)):
                assert token.encode() not in ssh_host.read_bytes(f"/proc/{pid}/cmdline")
        finally:
            worker.stop()
        # A stop ends what names the install dir; the launcher, which does not, waits on.
        assert ssh_host.run(["kill", "-0", str(launcher)]).returncode == 0
        assert processes_mentioning(ssh_host, str(install_dir)) == []
        worker.cleanup()
    finally:
        session.close()
        ssh_host.run(["kill", str(launcher)])
    assert not ssh_host.exists(install_dir)


def test_a_hand_off_nothing_takes_fails_and_leaves_nothing(
    ssh_host: SshdHost, control_plane: ControlPlane, wheelhouse: Wheelhouse, tmp_path: Path
) -> None:
    install_dir = tmp_path / "gpulayer" / "job-n"
    plan = make_plan(install_dir, control_plane.port, control_plane.worker_token(), hand_off=True)
    session = connect(ssh_host)
    try:
        with pytest.raises(BootstrapError) as err:
            bootstrap_worker(session, plan, wheelhouse, lambda line: None, timeout=40)
    finally:
        session.close()
    assert any("no launcher on this machine started the worker" in line
               for line in err.value.output_tail), err.value.output_tail  # fmt: skip
    assert not ssh_host.exists(install_dir)
    assert control_plane.client.workers() == []


def test_second_job_on_a_host_uploads_no_wheels(
    ssh_host: SshdHost, control_plane: ControlPlane, wheelhouse: Wheelhouse, tmp_path: Path
) -> None:
    session = connect(ssh_host)
    try:
        for job in ("job-a", "job-b"):
            output: list[str] = []
            plan = make_plan(
                tmp_path / "gpulayer" / job,
                control_plane.port,
                control_plane.worker_token(),
                worker_name=job,
            )
            worker = bootstrap_worker(session, plan, wheelhouse, output.append, timeout=120)
            worker.stop()
            worker.cleanup()
            uploads = [line for line in output if "wheelhouse:" in line]
            if job == "job-a":
                assert f"uploading {len(wheelhouse.files)} of {len(wheelhouse.files)}" in uploads[0]
            else:
                # The worker's install is reused: no wheel is even looked at.
                assert uploads == [], uploads
                assert any("reusing its verified install" in line for line in output), output
        # The shared wheelhouse and worker install stay for the next job; the job dirs are gone.
        left = ssh_host.run(["ls", "-A", str(tmp_path / "gpulayer")], check=True).stdout
        assert left.split() == ["wheelhouse", "worker"]
    finally:
        session.close()


def test_a_changed_wheel_on_the_host_is_sent_again(
    ssh_host: SshdHost, control_plane: ControlPlane, wheelhouse: Wheelhouse, tmp_path: Path
) -> None:
    install_dir = tmp_path / "gpulayer" / "job-c"
    remote_wheels = tmp_path / "gpulayer" / "wheelhouse" / wheelhouse.key
    corrupt = next(w for w in wheelhouse.files if w.distribution == "gpulayer")
    broken = tmp_path / "broken.whl"
    broken.write_bytes(b"not a wheel")
    output: list[str] = []
    session = connect(ssh_host)
    try:
        # The host already holds the wheelhouse, one wheel of it damaged.
        session.makedirs(str(remote_wheels))
        for wheel in wheelhouse.files:
            session.put(wheelhouse.path / wheel.name, str(remote_wheels / wheel.name))
        session.put(broken, str(remote_wheels / corrupt.name))
        plan = make_plan(install_dir, control_plane.port, control_plane.worker_token())
        worker = bootstrap_worker(session, plan, wheelhouse, output.append, timeout=120)
        worker.stop()
        worker.cleanup()
    finally:
        session.close()
    assert any(f"uploading 1 of {len(wheelhouse.files)}" in line for line in output), output
    assert (
        ssh_host.read_bytes(remote_wheels / corrupt.name)
        == (wheelhouse.path / corrupt.name).read_bytes()
    )


def test_host_without_usable_python_fails_and_leaves_nothing(
    ssh_host: SshdHost, control_plane: ControlPlane, wheelhouse: Wheelhouse, tmp_path: Path
) -> None:
    install_dir = tmp_path / "gpulayer" / "job-4"
    plan = make_plan(
        install_dir, control_plane.port, control_plane.worker_token(), python="/nonexistent/python3"
    )
    session = connect(ssh_host)
    try:
        with pytest.raises(BootstrapError, match="'/nonexistent/python3' not found") as err:
            bootstrap_worker(session, plan, wheelhouse, lambda line: None, timeout=60)
        assert isinstance(err.value, HostIncompatible)
        assert session.connected
    finally:
        session.close()
    assert not ssh_host.exists(install_dir)
    assert not ssh_host.exists(tmp_path / "gpulayer" / "wheelhouse")
    assert processes_mentioning(ssh_host, str(install_dir)) == []
    assert control_plane.client.workers() == []


def test_wheelhouse_for_another_python_is_refused_before_installing(
    ssh_host: SshdHost, control_plane: ControlPlane, tmp_path: Path
) -> None:
    foreign = Wheelhouse(
        path=tmp_path / "foreign",
        python_tag="cp39",
        platform="linux_x86_64",
        files=(
            WheelFile(
                "native-1.0-cp39-cp39-manylinux_2_17_x86_64.whl",
                1,
                "0" * 64,
                "native",
                "1.0",
                ("cp39-cp39-manylinux_2_17_x86_64",),
            ),
        ),
        key="foreign",
    )
    install_dir = tmp_path / "gpulayer" / "job-5"
    plan = make_plan(install_dir, control_plane.port, control_plane.worker_token())
    session = connect(ssh_host)
    try:
        with pytest.raises(HostIncompatible, match=r"native-1\.0-cp39"):
            bootstrap_worker(session, plan, foreign, lambda line: None, timeout=60)
    finally:
        session.close()
    assert not ssh_host.exists(install_dir)


def test_worker_that_cannot_join_fails_with_its_log_and_leaves_nothing(
    ssh_host: SshdHost, control_plane: ControlPlane, wheelhouse: Wheelhouse, tmp_path: Path
) -> None:
    install_dir = tmp_path / "gpulayer" / "job-6"
    # The control plane refuses this token: the worker says so in one line and exits, and the
    # bootstrap fails with that line rather than waiting out its budget. The budget leaves room
    # for the install on a bare host of a loaded machine.
    plan = make_plan(install_dir, control_plane.port, "not-a-token-the-server-made")
    session = connect(ssh_host)
    try:
        with pytest.raises(BootstrapError, match=r"exited .* before joining") as err:
            bootstrap_worker(session, plan, wheelhouse, lambda line: None, timeout=90)
    finally:
        session.close()
    assert not isinstance(err.value, BootstrapTimeout)
    refusal = "the control plane refused to let this worker join"
    assert any(refusal in line for line in err.value.output_tail), err.value.output_tail
    assert "not-a-token-the-server-made" not in str(err.value)
    assert not ssh_host.exists(install_dir)
    assert processes_mentioning(ssh_host, str(install_dir)) == []
    assert control_plane.client.workers() == []


def test_bootstrap_past_its_time_budget_times_out_and_leaves_nothing(
    ssh_host: SshdHost, control_plane: ControlPlane, wheelhouse: Wheelhouse, tmp_path: Path
) -> None:
    install_dir = tmp_path / "gpulayer" / "job-7"
    plan = make_plan(install_dir, control_plane.port, control_plane.worker_token())
    session = connect(ssh_host)
    try:
        # Creating a venv and installing 18 wheels alone takes longer than this budget.
        with pytest.raises(BootstrapTimeout):
            bootstrap_worker(session, plan, wheelhouse, lambda line: None, timeout=1.0)
    finally:
        session.close()
    assert not ssh_host.exists(install_dir)
    assert processes_mentioning(ssh_host, str(install_dir)) == []


def test_deadman_switch_fires_once_the_tunnel_is_gone(
    ssh_host: SshdHost, control_plane: ControlPlane, wheelhouse: Wheelhouse, tmp_path: Path
) -> None:
    install_dir = tmp_path / "gpulayer" / "job-8"
    # On the host, beside the install dir the bootstrap creates.
    record = install_dir.parent / "deadman.jsonl"
    plan = make_plan(
        install_dir,
        control_plane.port,
        control_plane.worker_token(),
        deadman_seconds=2,
        deadman_action=f"record:{record}",
        heartbeat_seconds=0.3,
        worker_name="lonely",
    )
    session = connect(ssh_host)
    try:
        worker = bootstrap_worker(session, plan, wheelhouse, lambda line: None, timeout=120)
        try:
            assert not ssh_host.exists(record)
            worker.tunnel.close()
            eventually(
                lambda: ssh_host.exists(record) and ssh_host.read_text(record).strip(),
                what="a record",
            )
            entry = json.loads(ssh_host.read_text(record).splitlines()[0])
            assert entry["worker"] == "lonely"
            assert entry["silent_seconds"] >= 2
            eventually(
                lambda: worker.pid not in processes_mentioning(ssh_host, str(install_dir)),
                what="the worker to exit",
            )
        finally:
            worker.stop()
            worker.cleanup()
    finally:
        session.close()
    assert processes_mentioning(ssh_host, str(install_dir)) == []


def test_stop_ends_jobs_the_worker_started(
    ssh_host: SshdHost, control_plane: ControlPlane, wheelhouse: Wheelhouse, tmp_path: Path
) -> None:
    install_dir = tmp_path / "gpulayer" / "job-9"
    marker = f"job-of-{tmp_path.name}"
    plan = make_plan(install_dir, control_plane.port, control_plane.worker_token(), kind="remote")
    session = connect(ssh_host)
    try:
        worker = bootstrap_worker(session, plan, wheelhouse, lambda line: None, timeout=120)
        try:
            assert worker.worker_id is not None
            job = control_plane.client.submit(
                {
                    "workload": {
                        "kind": "command",
                        "command": ["python", "-c", "import time; time.sleep(600)", marker],
                    },
                    "placement": {"target": "remote", "worker_ids": [worker.worker_id]},
                }
            )
            wait_for_job(control_plane.client, job["id"], {"running"})
            eventually(lambda: processes_mentioning(ssh_host, marker), what="the job's process")
        finally:
            worker.stop()
            worker.cleanup()
    finally:
        session.close()
    assert processes_mentioning(ssh_host, marker) == []
    assert processes_mentioning(ssh_host, str(install_dir)) == []


def test_script_refuses_to_install_without_wheelhouse_or_index(
    ssh_host: SshdHost, tmp_path: Path
) -> None:
    install_dir = tmp_path / "gpulayer" / "job-10"
    script = install_dir / "bootstrap.sh"
    session = connect(ssh_host)
    try:
        session.makedirs(str(install_dir))
        session.put(bootstrap_script(), str(script))
        result = session.run(
            [
                "sh",
                str(script),
                "install",
                "--install-dir",
                str(install_dir),
                "--wheelhouse",
                str(tmp_path / "nowhere"),
                "--python",
                make_plan(install_dir, 1, "t").python,
            ],
            # A dead local port stands in for an index that cannot be reached.
            env={"PIP_INDEX_URL": "http://127.0.0.1:9/simple"},
        )
    finally:
        session.close()
    assert result.exit_code == 1
    assert "no wheelhouse" in result.stderr and "cannot be reached" in result.stderr
    assert ssh_host.exists(script)
    assert not ssh_host.exists(install_dir / "venv")


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("install_dir", "/", "install_dir"),
        ("install_dir", "/root", "install_dir"),
        ("install_dir", "/home/alice", "install_dir"),
        ("install_dir", "/usr/local/gpulayer", "install_dir"),
        ("install_dir", "/var/tmp", "install_dir"),
        ("install_dir", "relative/dir", "install_dir"),
        ("install_dir", "/var/tmp/gpulayer/../../etc", "install_dir"),
        ("control_plane_port", 0, "control_plane_port"),
        ("worker_token", "has space", "worker_token"),
        ("worker_name", "bad name", "worker_name"),
        ("deadman_action", "reboot", "deadman_action"),
        ("deadman_seconds", 0, "deadman_seconds"),
        ("kind", "local", "kind"),
        ("labels", {"k": "two\nlines"}, "labels.k"),
    ],
)
def test_plan_fields_are_checked_before_touching_a_host(
    field: str, value: object, named: str, tmp_path: Path
) -> None:
    plan = dataclasses.replace(
        make_plan(tmp_path / "gpulayer" / "job", 8765, "token"), **{field: value}
    )
    with pytest.raises(BootstrapPlanError, match=f"^{named}"):
        validate_plan(plan)
