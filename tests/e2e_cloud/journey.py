"""What the cloud journeys ask of the real command line: the last job, a job's ledger, polling."""

from __future__ import annotations

import json
import time
from typing import Any

from tests.support.cli import run_cli


def last_job() -> dict[str, Any]:
    jobs = json.loads(run_cli(["ls", "--json", "-n", "1"]).stdout)
    return dict(json.loads(run_cli(["status", jobs[0]["id"], "--json"]).stdout))


def ledger(job_id: str) -> dict[str, Any]:
    return dict(json.loads(run_cli(["cost", "--job", job_id, "--json"]).stdout))


def wait_until(check: Any, timeout: float = 90, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def wait_for_teardown(job_id: str, lab: Any) -> list[dict[str, Any]]:
    """The job's instances once all are gone and the lab (anything with hosts()) holds none.
    The job's end is reported at once; teardown follows in the control plane."""
    wait_until(
        lambda: all(
            i["state"] in ("terminated", "never_launched") for i in ledger(job_id)["instances"]
        ),
        what="teardown",
    )
    wait_until(lambda: not lab.hosts(), what="the instance's host to go")
    return list(ledger(job_id)["instances"])


_TELLING = (
    "Error",
    "error:",
    "Traceback",
    "failed",
    "exited with",
    "timed out",
    "refused",
    "terminate called",
    "what():",
)


def why_it_failed(output: str, limit: int = 6000) -> str:
    """The lines of a failed run's output that tell why (errors, tracebacks, exits), in
    order, with the last lines after them: enough to read a CI failure without the rest."""
    lines = output.splitlines()
    telling = [line for line in lines if any(mark in line for mark in _TELLING)] + [
        "--- last lines ---",
        *lines[-15:],
    ]
    text = "\n".join(telling)
    return text if len(text) <= limit else "..." + text[-limit:]
