"""`gpulayer server status|stop|restart`: the local control plane that commands start on
demand (a team server is run with `gpulayer server --host ... --port ...`)."""

from __future__ import annotations

import time
from typing import Any

import typer

from gpulayer.cli.output import print_json


def _describe(layout: Any) -> dict[str, Any]:
    from gpulayer.control.local_daemon import find_running, staleness

    running = find_running(layout)
    if running is None:
        return {"running": False, "home": str(layout.root)}
    info = running.info
    found = staleness(info)
    code = info.get("code") or {}
    return {
        "running": True,
        "home": str(layout.root),
        "pid": running.pid,
        "url": info.get("url"),
        "started": _iso(info.get("started")),
        "version": code.get("version"),
        "plugins": [line.split("=", 1)[0] for line in code.get("plugins") or []],
        "live_jobs": running.live_jobs(),
        "in_flight": _in_flight(running),
        "idle_seconds": info.get("idle_seconds"),
        "env": {k: v for k, v in (info.get("env") or {}).items() if v is not None},
        "restart_wanted": found.restart + [f"{name} changed" for name in found.refused],
    }


def _in_flight(running: Any) -> list[str]:
    from gpulayer.errors import NotFoundError

    try:
        return list(running.client.request("GET", "/v1/local").get("in_flight") or [])
    except NotFoundError:
        return []


# What `systemctl status` and LSB init scripts exit with for a unit that is not running, so a
# script can ask `gpulayer server status` without reading its output.
NOT_RUNNING_EXIT = 3


def status(as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts.")) -> None:
    """Whether the local control plane runs, since when, with what code and which live jobs;
    exits 3 when none runs."""
    from gpulayer.control.paths import home

    described = _describe(home())
    if as_json:
        print_json(described)
    elif not described["running"]:
        typer.echo(f"local control plane: not running (home {described['home']})")
    if not described["running"]:
        raise typer.Exit(NOT_RUNNING_EXIT)
    if as_json:
        return
    from datetime import datetime, timezone

    started = datetime.fromisoformat(described["started"])
    up = (datetime.now(timezone.utc) - started).total_seconds()
    live = described["live_jobs"]
    lines = [
        f"local control plane: running, pid {described['pid']}, at {described['url']}",
        f"  home: {described['home']}",
        f"  started: {started.strftime('%Y-%m-%d %H:%M:%S')} UTC ({_duration(up)} ago), "
        f"gpulayer {described['version']}, plugins: {', '.join(described['plugins']) or 'none'}",
        f"  live jobs: {len(live)}" + (f" ({', '.join(live)})" if live else ""),
        *(f"  in flight: {work}" for work in described["in_flight"]),
        f"  exits after {described['idle_seconds']:g} s idle with no live job",
    ]
    for name, value in described["env"].items():
        lines.append(f"  {name}={value}")
    if described["restart_wanted"]:
        lines.append(
            f"  restart wanted: {'; '.join(described['restart_wanted'])} (the next command "
            "restarts it once no job is live)"
        )
    typer.echo("\n".join(lines))


def _iso(stamp: Any) -> str | None:
    from datetime import datetime, timezone

    if not isinstance(stamp, (int, float)):
        return None
    return datetime.fromtimestamp(stamp, tz=timezone.utc).isoformat(timespec="seconds")


def _duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def _stop(layout: Any, force: bool) -> bool:
    """Stop the running daemon (waiting for its live jobs unless force). False: none ran."""
    from rich.console import Console

    from gpulayer.control.local_daemon import find_running, stop

    running = find_running(layout)
    if running is None:
        return False
    console = Console(stderr=True, highlight=False)
    with console.status("stopping the local control plane") as spinner:
        begun = time.monotonic()

        said: list[int] = []

        def waiting(live: list[str], in_flight: list[str]) -> None:
            named = live + in_flight
            shown = ", ".join(named[:3]) + (", ..." if len(named) > 3 else "")
            line = (
                f"waiting for {len(live)} live job{'s' if len(live) != 1 else ''} to end "
                f"({shown}; {time.monotonic() - begun:.0f} s; --force cancels them)"
            )
            if console.is_terminal:
                spinner.update(line)
            elif not said or said[-1] != len(live):
                # No spinner off a terminal: one line each time the count changes.
                said.append(len(live))
                console.print(line, soft_wrap=True)

        stop(running, force=force, wait_for_jobs=True, on_wait=waiting)
    return True


ForceOption = typer.Option(
    False, "--force", help="Cancel live jobs instead of waiting for them to end."
)


def stop_command(force: bool = ForceOption) -> None:
    """Stop the local control plane once its live jobs end (--force: cancel them first)."""
    from gpulayer.control.paths import home

    if _stop(home(), force):
        typer.echo("local control plane stopped")
    else:
        typer.echo("local control plane: not running")


def restart_command(force: bool = ForceOption) -> None:
    """Stop the local control plane (waiting for live jobs unless --force) and start it."""
    from gpulayer.control.local_daemon import find_running, start
    from gpulayer.control.paths import home

    layout = home().ensure()
    _stop(layout, force)
    start(layout)
    running = find_running(layout)
    pid = running.pid if running else "?"
    typer.echo(f"local control plane started, pid {pid}")


def register_local(server_app: typer.Typer) -> None:
    server_app.command("status")(status)
    server_app.command("stop")(stop_command)
    server_app.command("restart")(restart_command)
