"""`gpulayer schedule ...`: cron schedules kept by the control plane."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from gpulayer.cli.job_flag_options import with_job_flags
from gpulayer.cli.output import print_json
from gpulayer.cli.spec_flags import SubmitFlags

if TYPE_CHECKING:
    from gpulayer.sdk.connection import Connection
    from gpulayer.sdk.schedule_client import ScheduleClient

schedule_app = typer.Typer(
    name="schedule",
    help="Run a job on a cron: create, list, pause, resume, trigger, delete.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

ServerOption = typer.Option(
    None, "--server", help="Control plane URL (default: $GPULAYER_SERVER, else local)."
)
JsonOption = typer.Option(False, "--json", help="Print JSON for scripts.")
NameArgument = typer.Argument(..., help="Schedule name.")


def _connect(server: str | None) -> tuple[Connection, ScheduleClient]:
    from gpulayer.sdk.connection import connect
    from gpulayer.sdk.schedule_client import ScheduleClient

    connection = connect(server)
    return connection, ScheduleClient(connection.client)


def _send(document: dict[str, Any], server: str | None, as_json: bool) -> None:
    """Validate here (bad input exits 2 before anything is contacted), then apply."""
    from gpulayer.schedules.validate import validate_schedule
    from gpulayer.sdk.submission import source_fields

    validate_schedule(document)
    connection, schedules = _connect(server)
    answer = schedules.apply(document, **source_fields(connection, document["job"]))
    if as_json:
        print_json(answer)
        return
    view = answer["schedule"]
    verb = "created" if answer["created"] else "updated"
    typer.echo(f"schedule {view['name']} {verb}; next tick {view['next_tick'] or '-'}")


@schedule_app.command()
def apply(
    file: Path = typer.Option(..., "--file", "-f", help="Schedule file (JSON or YAML)."),
    as_json: bool = JsonOption,
    server: Optional[str] = ServerOption,
) -> None:
    """Create a schedule from a file, or update the one of that name (future ticks only)."""
    from gpulayer.sdk.paths import absolutize_paths
    from gpulayer.spec.loader import load_spec_data

    document = load_spec_data(file)
    if isinstance(document.get("job"), dict):
        absolutize_paths(document["job"], str(file.resolve().parent))
    _send(document, server, as_json)


@schedule_app.command()
@with_job_flags(leave_out=frozenset({"name"}))
def create(
    name: str = NameArgument,
    argv: Optional[list[str]] = typer.Argument(None, metavar="-- ARGV...", help="Command to run."),
    cron: list[str] = typer.Option(
        ..., "--cron", help="Cron expression: 5 fields, or 6 with seconds first (repeatable)."
    ),
    timezone: Optional[str] = typer.Option(
        None, "--timezone", help="IANA zone the cron is read in (default UTC)."
    ),
    concurrency: Optional[str] = typer.Option(
        None, "--concurrency", help="forbid (default), replace or allow."
    ),
    catch_up: Optional[str] = typer.Option(
        None, "--catch-up", help="latest (default) or none: ticks missed while down."
    ),
    starting_deadline: Optional[float] = typer.Option(
        None, "--starting-deadline", help="Skip a tick this many seconds late."
    ),
    budget: Optional[float] = typer.Option(
        None, "--budget", help="Most the schedule may spend per budget period."
    ),
    budget_period: Optional[str] = typer.Option(
        None, "--budget-period", help="day, week or month (default month)."
    ),
    budget_currency: Optional[str] = typer.Option(
        None, "--budget-currency", help="Currency of --budget (default USD)."
    ),
    suspend: bool = typer.Option(False, "--suspend", help="Create it paused."),
    as_json: bool = JsonOption,
    server: Optional[str] = ServerOption,
    job_flags: SubmitFlags = SubmitFlags(),
) -> None:
    """Create (or replace) a schedule running the command after `--` on a cron."""
    from gpulayer.cli.spec_flags import apply_flags
    from gpulayer.sdk.paths import absolutize_paths

    job = absolutize_paths(apply_flags(None, job_flags), os.getcwd())
    document: dict[str, Any] = {"name": name, "cron": cron[0] if len(cron) == 1 else cron}
    document["job"] = job
    optional = {
        "timezone": timezone,
        "concurrency": concurrency,
        "catch_up": catch_up,
        "starting_deadline_seconds": starting_deadline,
    }
    document.update({k: v for k, v in optional.items() if v is not None})
    if suspend:
        document["suspend"] = True
    if budget is not None:
        document["budget"] = {"max_cost": budget}
        if budget_period is not None:
            document["budget"]["period"] = budget_period
        if budget_currency is not None:
            document["budget"]["currency"] = budget_currency
    elif budget_period is not None or budget_currency is not None:
        from gpulayer.errors import UsageError

        raise UsageError("--budget: required with --budget-period or --budget-currency")
    from gpulayer.cli.submit_run import flags_named

    with flags_named(job_flags, under="job."):
        _send(document, server, as_json)


@schedule_app.command("ls")
def list_schedules(
    as_json: bool = JsonOption,
    server: Optional[str] = ServerOption,
) -> None:
    """List schedules: state, next tick, last run, budget."""
    connection, schedules = _connect(server)
    found = schedules.all()
    if as_json:
        print_json(found)
        return
    from gpulayer.cli.schedule_render import control_plane_note, schedules_table

    schedules_table(found)
    note = control_plane_note(connection, found)
    if note:
        typer.echo(note, err=True)


@schedule_app.command()
def show(
    name: str = NameArgument,
    as_json: bool = JsonOption,
    server: Optional[str] = ServerOption,
) -> None:
    """A schedule: its next 5 ticks, last runs with state and cost, spend in the period."""
    view = _connect(server)[1].show(name)
    if as_json:
        print_json(view)
        return
    from gpulayer.cli.schedule_render import schedule_panel

    schedule_panel(view)


@schedule_app.command()
def runs(
    name: str = NameArgument,
    limit: int = typer.Option(50, "--limit", "-n", help="How many ticks, newest first."),
    as_json: bool = JsonOption,
    server: Optional[str] = ServerOption,
) -> None:
    """Each decided tick: the job it made and its state, or why it was skipped."""
    found = _connect(server)[1].runs(name, limit=limit)
    if as_json:
        print_json(found)
        return
    from gpulayer.cli.schedule_render import runs_table

    runs_table(found)


def _action(name: str, action: str, as_json: bool, server: Optional[str]) -> None:
    schedules = _connect(server)[1]
    answer = schedules.delete(name) if action == "delete" else schedules.action(name, action)
    skipped = action == "trigger" and answer["job_id"] is None
    if as_json:
        print_json(answer)
        if skipped:
            raise typer.Exit(1)
        return
    if action == "trigger":
        if skipped:
            typer.echo(f"error: {name}: {answer['message']}", err=True)
            raise typer.Exit(1)
        typer.echo(answer["job_id"])
    elif action == "delete":
        typer.echo(f"schedule {name} deleted (its jobs stay listed)")
    else:
        typer.echo(f"schedule {name}: {answer['state']}")


_ACTIONS = {
    "pause": "Stop creating jobs (ticks are recorded as skipped: suspended).",
    "resume": "Create jobs again from the next tick on (suspended ticks are not caught up).",
    "delete": "Delete a schedule; the jobs it made stay, and live ones run on.",
    "trigger": "Run one now, outside the cron, still under concurrency and budget; prints the "
    "job id.",
}


def _action_command(action: str) -> None:
    def command(
        name: str = NameArgument, as_json: bool = JsonOption, server: Optional[str] = ServerOption
    ) -> None:
        _action(name, action, as_json, server)

    schedule_app.command(action, help=_ACTIONS[action])(command)


for _name in _ACTIONS:
    _action_command(_name)


def register(app: typer.Typer) -> None:
    app.add_typer(schedule_app)
