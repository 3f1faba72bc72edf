"""What `gpulayer submit` does after parsing: send the job, stream it, exit as it did."""

from __future__ import annotations

import signal
import sys
from typing import Any

from gpulayer.protocol.client import ControlClient
from gpulayer.sdk.submission import send_job

__all__ = [
    "describe_end",
    "exit_code_of",
    "print_line",
    "say_reconnecting",
    "send_job",
    "stream_until_done",
]


def print_line(line: dict[str, Any], *, timestamps: bool = False) -> None:
    text = line["text"]
    if not text.endswith("\n"):
        text += "\n"
    if line["stream"] not in ("stdout", "stderr"):
        text = f"gpulayer: {text}"
    if timestamps:
        # The control plane's receipt time, in UTC: one clock for every worker's lines.
        text = f"{line.get('at') or '-'} {text}"
    out = sys.stdout if line["stream"] == "stdout" else sys.stderr
    out.write(text)
    out.flush()


def say_reconnecting(exc: BaseException, seconds: float) -> None:
    """One line while a followed job's control plane is out of reach (a restart)."""
    sys.stderr.write(f"gpulayer: {exc}; reconnecting (for up to {seconds:g} s)\n")
    sys.stderr.flush()


def exit_code_of(job: dict[str, Any]) -> int:
    if job["state"] == "succeeded":
        return 0
    if job["state"] == "cancelled":
        return 130
    code = job.get("exit_code")
    if isinstance(code, int) and code > 0:
        return code
    if isinstance(code, int) and code < 0:
        return 128 + (-code)  # killed by a signal, as a shell reports it
    return 1


def describe_end(job: dict[str, Any]) -> str | None:
    if job["state"] == "succeeded":
        return None
    detail = f" ({job['message']})" if job.get("message") else ""
    return f"job {job['id']} {job['state']}: {job.get('reason') or 'unknown'}{detail}"


def stream_until_done(client: ControlClient, job_id: str) -> dict[str, Any]:
    """Print the job's output live; Ctrl-C cancels the job, then waits for it to end."""
    from gpulayer.cli.phases import PhaseDisplay

    after = 0
    cancelling = False
    phases = PhaseDisplay()
    while True:
        try:
            for item in client.follow_logs(job_id, after=after, on_reconnect=say_reconnecting):
                if "job" in item:
                    phases.close()
                    return dict(item["job"])
                after = item["id"]
                if item["stream"] == "system" and phases.live:
                    phases.phase(item["text"].rstrip("\n"))
                    continue
                phases.output_started()
                print_line(item)
        except KeyboardInterrupt:
            phases.close()
            if cancelling:
                raise
            cancelling = True
            sys.stderr.write(f"gpulayer: cancelling job {job_id} (Ctrl-C again to leave it)\n")
            # A second Ctrl-C while we wait should leave at once, not stack tracebacks.
            signal.signal(signal.SIGINT, signal.default_int_handler)
            client.reset()
            client.cancel(job_id)
