"""`gpulayer submit` read without the CLI framework, so a submit costs what it sends.

Importing typer and building its per-option validators costs more CPU than the submit
itself; a burst of submits from scripts pays it every time. This reads the submit command's
own flags (the same names and meanings as the typer command's, see job_commands.submit)
and hands them to submit_run. Anything else (--help, an unknown flag, a value it would read
differently, no command after ``--`` and no ``-f``) returns None, and the typer command
answers as always, with its usual messages.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

_VALUES = {
    "--name": "name",
    "--profile": "profile",
    "--target": "target",
    "--accelerator": "accelerator",
    "--gpus": "gpus",
    "--timeout": "timeout",
    "--max-hourly-cost": "max_hourly_cost",
    "--file": "file",
    "-f": "file",
    "--server": "server",
    "--array": "array",
}
_LISTS = {
    "--fallback": "fallback",
    "--gpu": "gpu_models",
    "--env": "env",
    "--secret": "secrets",
    "--input": "inputs",
    "--worker-label": "worker_labels",
    "--label": "labels",
    "--provider": "providers",
    "--region": "regions",
}
_DETACH = frozenset({"-d", "--detach"})
_INTEGER = re.compile(r"-?[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?", re.ASCII)
LEFT_TO_TYPER = frozenset({"--dry-run", "--json", "--gpu-slices", "--nodes", "--help"})
"""The submit command's flags this path does not read: a line holding one goes to typer.
With the tables above, these are every flag of typer's `submit` (a unit test holds the two
equal, and a property test holds the readings equal over generated flag lists)."""


@dataclass
class FastSubmit:
    argv: list[str] = field(default_factory=list)
    values: dict[str, str] = field(default_factory=dict)
    lists: dict[str, list[str]] = field(default_factory=dict)
    detach: bool = False


def parse(args: list[str]) -> FastSubmit | None:
    """The submit command's flags, or None where the typer command should read them."""
    if not args or args[0] != "submit":
        return None
    found = FastSubmit(lists={name: [] for name in _LISTS.values()})
    rest = args[1:]
    i = 0
    while i < len(rest):
        token = rest[i]
        if token == "--":
            found.argv = rest[i + 1 :]
            break
        name, eq, inline = token.partition("=") if token.startswith("--") else (token, "", "")
        if name in _DETACH and not eq:
            found.detach = True
            i += 1
            continue
        if name not in _VALUES and name not in _LISTS:
            return None  # help, a flag of another shape, a positional word: typer's to read
        if eq:
            value = inline
            i += 1
        elif i + 1 < len(rest) and not rest[i + 1].startswith("-"):
            value = rest[i + 1]
            i += 2
        else:
            return None
        if name in _VALUES:
            found.values[_VALUES[name]] = value
        else:
            found.lists[_LISTS[name]].append(value)
    if not found.argv and "file" not in found.values:
        return None
    return found


def run(found: FastSubmit) -> int | None:
    """Submit as the typer command would; None when a value needs the typer command."""
    from gpulayer.cli.spec_flags import SubmitFlags
    from gpulayer.cli.submit_run import run_submit

    values = found.values
    # Only plain ASCII numbers are read here: Python's int() and float() also take other
    # scripts' digits, underscores and spaces, which typer refuses, naming the flag.
    if any(
        key in values and not pattern.fullmatch(values[key])
        for key, pattern in (
            ("gpus", _INTEGER),
            ("timeout", _DECIMAL),
            ("max_hourly_cost", _DECIMAL),
        )
    ):
        return None
    gpus = int(values["gpus"]) if "gpus" in values else None
    timeout = float(values["timeout"]) if "timeout" in values else None
    cost = float(values["max_hourly_cost"]) if "max_hourly_cost" in values else None
    flags = SubmitFlags(
        argv=found.argv,
        name=values.get("name"),
        profile=values.get("profile"),
        target=values.get("target"),
        accelerator=values.get("accelerator"),
        gpus=gpus,
        timeout=timeout,
        max_hourly_cost=cost,
        gpu_slices=False,  # --gpu-slices is typer's to read
    )
    for name, items in found.lists.items():
        setattr(flags, name, items)
    file = Path(values["file"]) if "file" in values else None
    return run_submit(
        file=file,
        detach=found.detach,
        server=values.get("server"),
        flags=flags,
        array=values.get("array"),
        dry_run=False,  # --dry-run is typer's to read: it plans instead
        as_json=False,
    )


def main(args: list[str]) -> bool:
    """Run `gpulayer submit` here when it can; False leaves it to the typer application."""
    found = parse(args)
    if found is None:
        return False
    from gpulayer.cli.exits import leave_with
    from gpulayer.errors import GpulayerError

    try:
        code = run(found)
    except (GpulayerError, KeyboardInterrupt) as exc:
        leave_with(exc)
    if code is None:
        return False
    sys.exit(code)
