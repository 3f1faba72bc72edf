"""A worker started before its control plane is up keeps trying to join, and a stop ends it."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.support.procs import wait_until
from tests.support.servers import WorkerProcess, free_port


def test_a_worker_still_waiting_to_join_stops_on_sigterm(tmp_path: Path) -> None:
    home = tmp_path / "worker"
    worker = WorkerProcess(f"http://127.0.0.1:{free_port()}", "gl_join", home, "early")
    worker.start()
    log = home / "worker.log"
    assert worker.process is not None
    try:
        wait_until(
            lambda: log.read_text().count("cannot join yet") >= 3,
            120,
            "the worker retries its join while nothing answers",
        )
        worker.signal(signal.SIGTERM)
        code = worker.process.wait(timeout=120)
    finally:
        worker.kill_everything()
    text = log.read_text()
    assert code == 0, text
    assert "stopping: ending running jobs" in text
    assert "joined" not in text
