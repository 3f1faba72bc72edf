"""Test hosts leave nothing behind: not after a clean close, not after a crashed run."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

from gpulayer.ssh.session import SshSession
from gpulayer.ssh.tunnel import open_reverse_tunnel
from tests.support.sshd_hosts import SshdHost, SshdLab, cleanup_stale

REPO = Path(__file__).resolve().parents[3]


def _processes_with(word: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if word.encode() in cmdline.split(b"\0"):
                found.append(int(entry.name))
    return found


def test_close_removes_hosts_sessions_and_detached_processes(tmp_path: Path) -> None:
    lab = SshdLab.create(tmp_path / "lab")
    try:
        hosts = lab.add_hosts(3)
        nap = f"1000.{secrets.randbelow(10**6)}"
        session = SshSession(hosts[0].target()).connect()
        # Escapes sshd's process tree: only the marker or the namespace can still find it.
        session.exec(f"setsid sleep {nap} </dev/null >/dev/null 2>&1 &")
        open_reverse_tunnel(session, 9)
        hosts[1].run(f"setsid sleep {nap} </dev/null >/dev/null 2>&1 &", check=True)
        hosts[2].stop()
        assert len(_processes_with(nap)) == 2
        assert lab.leftovers()  # the run is visible while it lives
    finally:
        lab.close()
    assert lab.leftovers() == []
    assert _processes_with(nap) == []
    session.close()


def test_stale_run_of_a_killed_process_is_cleaned_and_live_runs_are_not(
    tmp_path: Path, ssh_host: SshdHost
) -> None:
    nap = f"1000.{secrets.randbelow(10**6)}"
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from tests.support.sshd_hosts import SshdLab\n"
        f"lab = SshdLab.create(Path({str(tmp_path / 'crash')!r}))\n"
        "hosts = lab.add_hosts(2)\n"
        f"hosts[0].run('setsid sleep {nap} </dev/null >/dev/null 2>&1 &', check=True)\n"
        "print(lab.run_id, lab.mode, flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        run_id, mode = proc.stdout.readline().split()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    crashed = SshdLab(tmp_path / "crash", mode, run_id)  # type: ignore[arg-type]
    assert crashed.leftovers()
    assert _processes_with(nap)

    removed = cleanup_stale()

    assert f"state {run_id}" in removed
    assert crashed.leftovers() == []
    assert _processes_with(nap) == []
    # This session's own lab belongs to a living run and is untouched.
    with SshSession(ssh_host.target()) as session:
        assert session.run("echo still").stdout == "still\n"
