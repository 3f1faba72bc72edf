"""Rich rendering of schedules and their runs for people (scripts use --json)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from gpulayer.cli.fit import Column, print_fitted

if TYPE_CHECKING:
    from gpulayer.sdk.connection import Connection


def _console() -> Console:
    return Console(highlight=False)


def _cron(view: dict[str, Any]) -> str:
    cron = view["cron"]
    return cron if isinstance(cron, str) else " | ".join(cron)


def _budget(budget: dict[str, Any] | None) -> str:
    if not budget:
        return "-"
    return (
        f"{budget['spent']:.2f}/{budget['max_cost']:g} {budget['currency']} per {budget['period']}"
    )


def _when(value: str | None) -> str:
    """A tick as month-day time, for tables: the zone is in its own column."""
    return value[5:19].replace("T", " ") if value else "-"


def _last(run: dict[str, Any] | None) -> str:
    if not run:
        return "-"
    if run["job_id"]:
        return str(run["job_state"] or "?")
    return f"skipped: {run['outcome']}"


def schedules_table(found: list[dict[str, Any]]) -> None:
    table = Table(box=None, header_style="bold")
    table.add_column("NAME", no_wrap=True)
    for column in ("STATE", "CRON", "ZONE", "POLICY", "NEXT", "LAST", "BUDGET"):
        table.add_column(column)
    for view in found:
        table.add_row(
            view["name"],
            view["state"],
            _cron(view),
            view["timezone"],
            view["concurrency"],
            _when(view["next_tick"]),
            _last(view["last_run"]),
            _budget(view["budget"]),
        )
    _console().print(table)


def control_plane_note(connection: Connection, found: list[dict[str, Any]]) -> str | None:
    """Say that the on-demand local control plane stays up for active schedules."""
    active = sum(1 for view in found if view["state"] == "active")
    if not connection.embedded:
        return None
    pid = connection.client.health().get("pid")
    if active:
        return (
            f"the local control plane (pid {pid}) stays up while {active} schedule(s) are "
            "active; pause or delete them to let it exit when idle"
        )
    return f"no active schedule; the local control plane (pid {pid}) exits when idle"


def runs_table(runs: list[dict[str, Any]]) -> None:
    rows = [
        (
            _when(run["tick"]),
            ("created" if run["job_id"] else f"skipped: {run['outcome']}")
            + (" (trigger)" if run["manual"] else ""),
            run["job_id"] or "",
            run["job_state"] or "",
            "" if run["cost"] is None else f"{run['cost']:.4f}",
            "" if run["late_seconds"] is None else f"{run['late_seconds']:.2f} s",
            run["message"] or "",
        )
        for run in runs
    ]
    columns = (
        Column("TICK"),
        Column("OUTCOME", prose=True),
        Column("JOB"),
        Column("STATE"),
        Column("COST", drop=2, justify="right"),
        Column("LATE", drop=1, prose=True, justify="right"),
        Column("NOTE", prose=True),
    )
    print_fitted(_console(), columns, rows)


def schedule_panel(view: dict[str, Any]) -> None:
    console = _console()
    rows = [
        ("name", view["name"]),
        ("state", view["state"]),
        ("cron", _cron(view)),
        ("timezone", view["timezone"]),
        ("concurrency", view["concurrency"]),
        ("catch up", view["catch_up"]),
        ("live runs", ", ".join(view["live_runs"]) or "-"),
    ]
    budget = view.get("budget")
    if budget:
        rows += [
            ("budget", f"{budget['max_cost']:g} {budget['currency']} per {budget['period']}"),
            ("period", f"{budget['period_start']} to {budget['period_end']}"),
            ("spent", f"{budget['spent']:.4f} {budget['currency']}"),
            ("left", f"{budget['left']:.4f} {budget['currency']}"),
            ("next run", f"may cost {budget['next_run_worst_case']:.4f}"),
        ]
    for key, value in rows:
        console.print(f"[bold]{key:<12}[/] {value}")
    console.print("[bold]next ticks[/]")
    for tick in view["next_ticks"] or ["(paused)" if view["state"] == "paused" else "-"]:
        console.print(f"  {tick}")
    console.print("[bold]last runs[/]")
    runs_table(view["runs"])
