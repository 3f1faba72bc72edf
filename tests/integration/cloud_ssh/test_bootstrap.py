"""bootstrap_worker end to end: a real control plane, a real sshd host, the real script."""

from __future__ import annotations

import dataclasses
import json
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
            assert worker.pid in processes_mentioning(str(install_dir / "venv"))
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
    assert not install_dir.exists()
    assert processes_mentioning(str(install_dir)) == []
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
            pids = processes_mentioning(str(install_dir))
            assert worker.pid in pids
            for pid in pids:
                assert token.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
            # It reached the worker through its environment instead.
            assert (
                f"GPULAYER_TOKEN={token}".encode()
                in Path(f"/proc/{worker.pid}/environ").read_bytes()
            )
            assert not (install_dir / "worker.token").exists()
            assert all(token not in line for line in output)
            assert token not in (install_dir / "worker.log").read_text()
        finally:
            worker.stop()
            worker.cleanup()
    finally:
        session.close()


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
                assert "already on the host" in uploads[0], uploads
        # The shared wheelhouse stays for the next job; the job dirs are gone.
        assert sorted(p.name for p in (tmp_path / "gpulayer").iterdir()) == ["wheelhouse"]
    finally:
        session.close()


def test_a_changed_wheel_on_the_host_is_sent_again(
    ssh_host: SshdHost, control_plane: ControlPlane, wheelhouse: Wheelhouse, tmp_path: Path
) -> None:
    install_dir = tmp_path / "gpulayer" / "job-c"
    remote_wheels = tmp_path / "gpulayer" / "wheelhouse" / wheelhouse.key
    remote_wheels.mkdir(parents=True)
    for wheel in wheelhouse.files:
        (remote_wheels / wheel.name).write_bytes((wheelhouse.path / wheel.name).read_bytes())
    corrupt = next(w for w in wheelhouse.files if w.distribution == "gpulayer")
    (remote_wheels / corrupt.name).write_bytes(b"not a wheel")
    output: list[str] = []
    session = connect(ssh_host)
    try:
        plan = make_plan(install_dir, control_plane.port, control_plane.worker_token())
        worker = bootstrap_worker(session, plan, wheelhouse, output.append, timeout=120)
        worker.stop()
        worker.cleanup()
    finally:
        session.close()
    assert any(f"uploading 1 of {len(wheelhouse.files)}" in line for line in output), output
    assert (remote_wheels / corrupt.name).read_bytes() == (
        wheelhouse.path / corrupt.name
    ).read_bytes()


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
    assert not install_dir.exists()
    assert not (tmp_path / "gpulayer" / "wheelhouse").exists()
    assert processes_mentioning(str(install_dir)) == []
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
    assert not install_dir.exists()


def test_worker_that_cannot_join_fails_with_its_log_and_leaves_nothing(
    ssh_host: SshdHost, control_plane: ControlPlane, wheelhouse: Wheelhouse, tmp_path: Path
) -> None:
    install_dir = tmp_path / "gpulayer" / "job-6"
    # The control plane refuses this token, so the worker keeps retrying until the bootstrap's
    # budget for joining runs out.
    plan = make_plan(install_dir, control_plane.port, "not-a-token-the-server-made")
    session = connect(ssh_host)
    try:
        with pytest.raises(BootstrapError, match="did not join") as err:
            bootstrap_worker(session, plan, wheelhouse, lambda line: None, timeout=25)
    finally:
        session.close()
    assert not isinstance(err.value, BootstrapTimeout)
    assert any("cannot join yet" in line for line in err.value.output_tail), err.value.output_tail
    assert "not-a-token-the-server-made" not in str(err.value)
    assert not install_dir.exists()
    assert processes_mentioning(str(install_dir)) == []
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
    assert not install_dir.exists()
    assert processes_mentioning(str(install_dir)) == []


def test_deadman_switch_fires_once_the_tunnel_is_gone(
    ssh_host: SshdHost, control_plane: ControlPlane, wheelhouse: Wheelhouse, tmp_path: Path
) -> None:
    install_dir = tmp_path / "gpulayer" / "job-8"
    record = tmp_path / "deadman.jsonl"
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
            assert not record.exists()
            worker.tunnel.close()
            eventually(lambda: record.exists() and record.read_text().strip(), what="a record")
            entry = json.loads(record.read_text().splitlines()[0])
            assert entry["worker"] == "lonely"
            assert entry["silent_seconds"] >= 2
            eventually(
                lambda: worker.pid not in processes_mentioning(str(install_dir)),
                what="the worker to exit",
            )
        finally:
            worker.stop()
            worker.cleanup()
    finally:
        session.close()
    assert processes_mentioning(str(install_dir)) == []


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
            eventually(lambda: processes_mentioning(marker), what="the job's process")
        finally:
            worker.stop()
            worker.cleanup()
    finally:
        session.close()
    assert processes_mentioning(marker) == []
    assert processes_mentioning(str(install_dir)) == []


def test_script_refuses_to_install_without_wheelhouse_or_index(
    ssh_host: SshdHost, tmp_path: Path
) -> None:
    install_dir = tmp_path / "gpulayer" / "job-10"
    install_dir.mkdir(parents=True)
    script = install_dir / "bootstrap.sh"
    script.write_bytes(bootstrap_script().read_bytes())
    session = connect(ssh_host)
    try:
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
    assert not (install_dir / "venv").exists()


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
