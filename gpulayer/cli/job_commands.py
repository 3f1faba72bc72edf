"""Job commands: submit, ls, status, logs, cancel, artifacts, workers."""

from __future__ import annotations

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
    array: Optional[str] = typer.Option(
        None,
        "--array",
        help="A job array: one job per index (0-99, 1,3,5, 0-99%10 runs at most 10 at once); "
        "each sees its index as $GPULAYER_ARRAY_INDEX.",
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Print where the job would run and why (as `gpulayer plan`); create nothing.",
    ),
    as_json: bool = typer.Option(False, "--json", help="With --dry-run: the plan as JSON."),
    server: Optional[str] = ServerOption,
    job_flags: SubmitFlags = SubmitFlags(),
) -> None:
    """Run a job from a job file or the command after `--`; stream it, exit as it did."""
    from gpulayer.cli.submit_run import run_submit
    from gpulayer.errors import UsageError

    if as_json and not dry_run:
        raise UsageError("--json: only with --dry-run (submit streams the job's own output)")
    code = run_submit(
        file=file,
        detach=detach,
        server=server,
        flags=job_flags,
        array=array,
        dry_run=dry_run,
        as_json=as_json,
    )
    if code:
        raise typer.Exit(code)


@with_job_flags()
def plan(
    argv: Optional[list[str]] = typer.Argument(None, metavar="-- ARGV...", help="Command to run."),
    file: Optional[Path] = typer.Option(None, "--file", "-f", help="Job file (JSON or YAML)."),
    as_json: bool = JsonOption,
    server: Optional[str] = ServerOption,
    job_flags: SubmitFlags = SubmitFlags(),
) -> None:
    """Where a job would run and why, creating nothing: each target tried in order, the
    workers that fit and why others do not, the cheapest cloud offers and their worst-case
    cost, and why each cheaper offer was turned down. Takes submit's flags; exits 1 when
    submit would refuse the job."""
    from gpulayer.cli.plan_view import show_plan, would_refuse
    from gpulayer.cli.submit_run import flags_named, job_data, plan_job_data

    with flags_named(job_flags):
        data = job_data(file, job_flags)
        planned = plan_job_data(_connect(server), data)
    show_plan(planned, as_json=as_json)
    if would_refuse(planned):
        raise typer.Exit(1)


def ls(
    limit: int = typer.Option(20, "--limit", "-n", help="How many jobs, newest first."),
    state: list[str] = typer.Option(
        [], "--state", help="Only jobs in this state (repeatable: any of them)."
    ),
    label: list[str] = typer.Option(
        [], "--label", help="Only jobs with this KEY=VALUE label (repeatable: all of them)."
    ),
    schedule: Optional[str] = typer.Option(
        None, "--schedule", help="Only the runs of this schedule."
    ),
    array: Optional[str] = typer.Option(None, "--array", help="Only this job array's jobs."),
    as_json: bool = JsonOption,
    server: Optional[str] = ServerOption,
) -> None:
    """List jobs, newest first (an array's by index)."""
    from gpulayer.control.job_filters import check_states, parse_label_pairs, with_schedule

    states = check_states(state, "--state")
    labels = with_schedule(parse_label_pairs(label, "--label"), schedule, "--schedule")
    if array is not None:
        from gpulayer.cli.job_arrays import array_members, is_array_id

        if not is_array_id(array):
            raise typer.BadParameter("an array id looks like a-0123456789", param_hint="--array")
        members = array_members(_connect(server), array)
        jobs = [
            j
            for j in members
            if (not states or j["state"] in states)
            and all(j["labels"].get(k) == v for k, v in labels.items())
        ][:limit]
    else:
        jobs = _connect(server).client.jobs(
            limit=limit, states=states or None, labels=labels or None
        )
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
    """Show a job (or a job array, by its a-... id): state, reason, attempts, times, result."""
    from gpulayer.cli import job_arrays

    if job_arrays.is_array_id(job):
        job_arrays.show_status(_connect(server), job, as_json=as_json)
        return
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
    from gpulayer.cli.submit_flow import print_line, say_reconnecting
    from gpulayer.errors import UsageError

    if node is not None and node < 0:
        raise UsageError("--node: a node rank is 0 or more")
    from gpulayer.cli import job_arrays

    if job_arrays.is_array_id(job):
        job_arrays.print_logs(
            _connect(server), job, follow=follow, timestamps=timestamps, as_json=as_json
        )
        return
    client = _connect(server).client
    if node is not None:
        _check_node(client.job(job), node)
    lines: Iterator[dict[str, Any]]
    if follow:
        followed = client.follow_logs(job, node=node, on_reconnect=say_reconnecting)
        lines = (item for item in followed if "job" not in item)
    else:
        lines = client.iter_logs(job, node=node)  # page by page: memory stays flat
    if as_json:
        print_json_items(lines)
        return
    for line in lines:
        print_line(line, timestamps=timestamps)


def _check_node(view: dict[str, Any], node: int) -> None:
    """The flag named, rather than the API's parameter the control plane would name."""
    from gpulayer.errors import UsageError

    size = view.get("nodes")
    if isinstance(size, int) and node >= size:
        nodes = f"{size} node" if size == 1 else f"{size} nodes"
        raise UsageError(
            f"--node: job {view['id']} has {nodes} (ranks 0 to {size - 1}); there is no node {node}"
        )


def cancel(
    job: str = typer.Argument(..., help="Job id (or a unique prefix)."),
    as_json: bool = JsonOption,
    server: Optional[str] = ServerOption,
) -> None:
    """Cancel a job (or every job of an array): a queued job ends at once, a running one has
    its process tree ended."""
    from gpulayer.cli import job_arrays

    if job_arrays.is_array_id(job):
        job_arrays.cancel(_connect(server), job, as_json=as_json)
        return
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
    from gpulayer.cli.render import job_writes_persist, workers_table

    found = _connect(server).client.workers(include_gone=include_gone)
    if as_json:
        print_json(
            [{**worker, "job_writes_persist": job_writes_persist(worker)} for worker in found]
        )
        return

    workers_table(found)


def register(app: typer.Typer) -> None:
    for command in (submit, plan, ls, status, logs, cancel, artifacts, workers):
        app.command()(command)
