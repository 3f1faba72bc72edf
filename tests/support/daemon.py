"""Stop the local control plane a test started, by the pid it wrote down."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path


def stop_local_control_plane(home: Path, timeout: float = 10.0) -> None:
    server_file = home / "server.json"
    try:
        pid = int(json.loads(server_file.read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # A daemon this test process started stays a zombie once it has ended (nothing here
        # reaps it), and a zombie still answers signal 0: it counts as ended.
        if not pid_alive(pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has already ended
