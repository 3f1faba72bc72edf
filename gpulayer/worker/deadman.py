"""The dead-man switch: a worker that cannot reach its control plane for too long ends its
jobs and takes the action its provider set, so a lost controller never leaves a bill running.

Actions: `poweroff` (a cloud instance: powering off ends the bill, the provider terminates it on
shutdown), `stop` (a machine we do not own, e.g. an ssh-provider host: only the worker stops),
and `record:PATH` (tests: write what would be done, do nothing else; test hosts share the
machine that runs the tests).
"""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
from collections.abc import Callable

from gpulayer.protocol.deadman import DeadmanAction

log = logging.getLogger("gpulayer.worker")

POWEROFF_COMMANDS = (["systemctl", "poweroff"], ["shutdown", "-h", "now"], ["poweroff"])


class DeadmanSwitch:
    """Fires once when `silence_seconds` pass without a successful call to the control plane."""

    def __init__(
        self,
        silence_seconds: float,
        action: DeadmanAction,
        *,
        end_jobs: Callable[[], None],
        stop_worker: Callable[[], None],
        worker_name: str = "",
    ) -> None:
        self.silence_seconds = silence_seconds
        self.action = action
        self._end_jobs = end_jobs
        self._stop_worker = stop_worker
        self._worker_name = worker_name
        self._last_contact = time.monotonic()
        self._fired = threading.Event()
        self._closed = threading.Event()

    def contact(self) -> None:
        self._last_contact = time.monotonic()

    @property
    def fired(self) -> bool:
        return self._fired.is_set()

    def start(self) -> None:
        threading.Thread(target=self._watch, name="gpulayer-deadman", daemon=True).start()

    def close(self) -> None:
        self._closed.set()

    def _watch(self) -> None:
        interval = max(0.1, min(5.0, self.silence_seconds / 10))
        while not self._closed.wait(interval):
            silent = time.monotonic() - self._last_contact
            if silent >= self.silence_seconds:
                self._fire(silent)
                return

    def _fire(self, silent: float) -> None:
        self._fired.set()
        log.error(
            "no contact with the control plane for %.0f s: ending jobs, then %s",
            silent,
            self.action.describe(),
        )
        self._end_jobs()
        if self.action.kind == "record":
            assert self.action.record_path is not None
            entry = {
                "action": "poweroff-or-stop",
                "worker": self._worker_name,
                "silent_seconds": round(silent, 1),
                "at": time.time(),
            }
            with self.action.record_path.open("a") as out:
                out.write(json.dumps(entry) + "\n")
        elif self.action.kind == "poweroff":
            for argv in POWEROFF_COMMANDS:
                try:
                    if subprocess.run(argv, check=False, timeout=30).returncode == 0:
                        break
                except (OSError, subprocess.TimeoutExpired):
                    continue
        self._stop_worker()
