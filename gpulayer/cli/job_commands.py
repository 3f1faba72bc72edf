"""Job commands: submit, ls, status, logs, cancel, artifacts, workers."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from gpulayer.cli.job_flag_options import with_job_flags
from gpulayer.cli.output import print_json, print_json_items
from gpulayer.cli.spec_flags import SubmitFlags

if TYPE_CHECKING:
    from gpulayer.sdk.connection import Connection

ServerOption = typer.Option(
    None, "--server", help="Control plane URL (default: $GPULAYER_SERVER, else local)."
)
JsonOption = typer.Option(False, "--json", help="Print JSON for scripts.")


def _connect(server: str | None) -> Connection:
    from gpulayer.sdk.connection import connect

    return connect(server)


@with_job_flags()
def submit(
    argv: Optional[list[str]] = typer.Argument(None, metavar="-- ARGV...", help="Command to run."),
    file: Optional[Path] = typer.Option(None, "--file", "-f", help="Job file (JSON or YAML)."),
    detach: bool = typer.Option(
        False, "--detach", "-d", help="Print the job id and return at once."
    ),
    server: Optional[str] = ServerOption,
    job_flags: SubmitFlags = SubmitFlags(),
) -> None:
    """Run a job from a job file or the command after `--`; stream it, exit as it did."""
    from gpulayer.cli.spec_flags import apply_flags
    from gpulayer.cli.submit_flow import describe_end, exit_code_of, send_job, stream_until_done
    from gpulayer.sdk.paths import absolutize_paths

    base = None
    if file is not None:
        from gpulayer.spec.loader import load_spec_data

        base = absolutize_paths(load_spec_data(file), str(file.resolve().parent))
    data = absolutize_paths(apply_flags(base, job_flags), os.getcwd())
    connection = _connect(server)
    job = send_job(connection, data)
    for warning in job.get("warnings", []):
        sys.stderr.write(f"warning: {warning}\n")
    if detach:
        typer.echo(job["id"])
        if job["state"] == "failed":
            sys.stderr.write(f"error: {describe_end(job)}\n")
            raise typer.Exit(1)
        return
    final = stream_until_done(connection.client, job["id"])
    ending = describe_end(final)
    if ending:
        sys.stderr.write(f"gpulayer: {ending}\n")
    raise typer.Exit(exit_code_of(final))


def ls(
    limit: int = typer.Option(20, "--limit", "-n", help="How many jobs, newest first."),
    state: list[str] = typer.Option([], "--state", help="Only jobs in this state (repeatable)."),
    as_json: bool = JsonOption,
    server: Optional[str] = ServerOption,
) -> None:
    """List jobs, newest first."""
    jobs = _connect(server).client.jobs(limit=limit, states=state or None)
    if as_json:
        print_json(jobs)
        return
    from gpulayer.cli.render import jobs_table

    jobs_table(jobs)


def status(
    job: str = typer.Argument(..., help="Job id (or a unique prefix)."),
    as_json: bool = JsonOption,
    server: Optional[str] = ServerOption,
) -> None:
    """Show a job: state, reason, attempts and where they ran, times, result."""
    view = _connect(server).client.job(job)
    if as_json:
        print_json(view)
        return
    from gpulayer.cli.render import job_panel

    job_panel(view)


def logs(
    job: str = typer.Argument(..., help="Job id (or a unique prefix)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the job ends."),
    node: Optional[int] = typer.Option(
        None, "--node", help="Only this node's lines, by node rank (multi-node jobs)."
    ),
    timestamps: bool = typer.Option(
        False, "--timestamps", "-t", help="Prefix each line with when it arrived (UTC, ISO 8601)."
    ),
    as_json: bool = JsonOption,
    server: Optional[str] = ServerOption,
) -> None:
    """Print a job's output (stdout to stdout, stderr and gpulayer's notes to stderr)."""
    from gpulayer.cli.submit_flow import print_line
    from gpulayer.errors import UsageError

    if node is not None and node < 0:
        raise UsageError("--node: a node rank is 0 or more")
    client = _connect(server).client
    lines: Iterator[dict[str, Any]]
    if follow:
        lines = (item for item in client.follow_logs(job, node=node) if "job" not in item)
    else:
        lines = client.iter_logs(job, node=node)  # page by page: memory stays flat
    if as_json:
        print_json_items(lines)
        return
    for line in lines:
        print_line(line, timestamps=timestamps)


def cancel(
    job: str = typer.Argument(..., help="Job id (or a unique prefix)."),
    as_json: bool = JsonOption,
    server: Optional[str] = ServerOption,
) -> None:
    """Cancel a job: a queued job ends at once, a running one has its process tree ended."""
    view = _connect(server).client.cancel(job)
    if as_json:
        print_json(view)
        return
    note = " (stopping)" if view["state"] == "running" else ""
    typer.echo(f"{view['id']}: {view['state']}{note}")


def artifacts(
    job: str = typer.Argument(..., help="Job id (or a unique prefix)."),
    download: Optional[Path] = typer.Option(
        None, "--download", help="Copy the outputs into this folder."
    ),
    as_json: bool = JsonOption,
    server: Optional[str] = ServerOption,
) -> None:
    """List (or download) the files a job wrote under $GPULAYER_OUTPUT_DIR."""
    client = _connect(server).client
    files = client.artifacts(job)
    if download is not None:
        for entry in files:
            client.download_artifact(job, entry["path"], download / entry["path"])
    if as_json:
        print_json(files)
        return
    for entry in files:
        typer.echo(f"{entry['size']:>12}  {entry['path']}")
    if download is not None:
        typer.echo(f"{len(files)} file(s) written to {download}", err=True)


def workers(
    include_gone: bool = typer.Option(
        False, "--all", help="Also workers that are gone (their cloud machine was handed back)."
    ),
    as_json: bool = JsonOption,
    server: Optional[str] = ServerOption,
) -> None:
    """List workers with their state, load and what they report."""
    found = _connect(server).client.workers(include_gone=include_gone)
    if as_json:
        print_json(found)
        return
    from gpulayer.cli.render import workers_table

    workers_table(found)


def register(app: typer.Typer) -> None:
    for command in (submit, ls, status, logs, cancel, artifacts, workers):
        app.command()(command)
