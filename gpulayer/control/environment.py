"""GPULAYER_* variables: who reads each, and when a change made in the shell takes effect.

The local control plane outlives the shell that started it, so it would keep the environment of
that first command. Variables it reads while working (``next_job``) are sent to it by each
command and apply from the next job on; those it reads only when it starts (``restart``) make
the CLI restart it when no job is live, and are otherwise refused with a line saying so.
Variables the CLI itself reads (``command``) apply to each command.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Applies = Literal["command", "next_job", "restart"]


@dataclass(frozen=True)
class Variable:
    name: str
    applies: Applies
    meaning: str


VARIABLES: tuple[Variable, ...] = (
    Variable(
        "GPULAYER_HOME",
        "command",
        "Where state lives (store, tokens, logs, providers.yaml); each home has its own "
        "local control plane.",
    ),
    Variable(
        "GPULAYER_SERVER",
        "command",
        "A team server's URL: commands use it instead of the local control plane.",
    ),
    Variable("GPULAYER_TOKEN", "command", "The token for GPULAYER_SERVER (never recorded)."),
    Variable(
        "GPULAYER_PROVIDERS_FILE",
        "next_job",
        "Where providers.yaml is read from (default: the home's providers.yaml).",
    ),
    Variable(
        "GPULAYER_IMAGES_DIR",
        "next_job",
        "A directory of image releases that wins over the shipped images/.",
    ),
    Variable(
        "GPULAYER_WHEELHOUSE_DIR",
        "next_job",
        "Where the worker's wheelhouse is built and kept instead of the user cache "
        "(~/.cache/gpulayer/wheelhouse, shared by every GPULAYER_HOME of the user).",
    ),
    Variable(
        "GPULAYER_DEADMAN_ACTION",
        "next_job",
        "What a rented machine's dead-man switch does (poweroff, stop, record:PATH); wins "
        "over providers.yaml's gpulayer.deadman_action.",
    ),
    Variable(
        "GPULAYER_IDLE_SECONDS",
        "restart",
        "How long the local control plane waits with no live job and no call before it exits "
        "(default 300).",
    ),
    Variable(
        "GPULAYER_MAX_LOG_BYTES",
        "restart",
        "The most output the store keeps per job (default 1GiB; newest bytes kept); the "
        "server's --max-log-bytes wins.",
    ),
    Variable(
        "GPULAYER_MAX_OUTPUT_FILES",
        "restart",
        "The most files one outputs upload of a remote worker may hold (default 10000); the "
        "server's --max-output-files wins. Over it: 413.",
    ),
    Variable(
        "GPULAYER_MAX_OUTPUT_BYTES",
        "restart",
        "The most bytes one outputs upload may expand to (default 20GiB); the server's "
        "--max-output-bytes wins. Over it: 413.",
    ),
    Variable(
        "GPULAYER_MAX_OUTPUT_RATIO",
        "restart",
        "How many times its compressed size an outputs upload may expand to once past 64 MiB "
        "(default 200); the server's --max-output-ratio wins. Over it: 413.",
    ),
    Variable(
        "GPULAYER_MAX_BUNDLE_BYTES",
        "restart",
        "The most bytes a source bundle's files may expand to (default 512MiB); checked on each "
        "member's header by the team server at upload and by a worker before it unpacks one.",
    ),
    Variable(
        "GPULAYER_MAX_BUNDLE_MEMBERS",
        "restart",
        "The most members (files, folders, links) a source bundle may hold (default 200000); "
        "checked as GPULAYER_MAX_BUNDLE_BYTES is.",
    ),
    Variable(
        "GPULAYER_MAX_BUNDLE_RATIO",
        "restart",
        "How many times its compressed size a source bundle may expand to once past 64 MiB "
        "(default 200: a compression bomb is refused); checked as GPULAYER_MAX_BUNDLE_BYTES is.",
    ),
    Variable(
        "GPULAYER_DATABASE_URL",
        "restart",
        "The team server's database (SQLAlchemy URL); read when `gpulayer server` starts.",
    ),
)

# What the local control plane reads: the variables a command compares with the daemon's.
TEAM_SERVER_ONLY = frozenset(
    {
        "GPULAYER_DATABASE_URL",
        # Outputs uploads come from remote workers; the local one hands its files over in place.
        "GPULAYER_MAX_OUTPUT_FILES",
        "GPULAYER_MAX_OUTPUT_BYTES",
        "GPULAYER_MAX_OUTPUT_RATIO",
        # Read by the server's upload check and by each worker process at its start.
        "GPULAYER_MAX_BUNDLE_BYTES",
        "GPULAYER_MAX_BUNDLE_MEMBERS",
        "GPULAYER_MAX_BUNDLE_RATIO",
    }
)
DAEMON_VARIABLES: tuple[str, ...] = tuple(
    v.name
    for v in VARIABLES
    if v.applies in ("next_job", "restart") and v.name not in TEAM_SERVER_ONLY
)
NEXT_JOB_VARIABLES: frozenset[str] = frozenset(v.name for v in VARIABLES if v.applies == "next_job")


def daemon_environment(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """The values of the variables the local control plane reads (None: unset)."""
    environ = os.environ if environ is None else environ
    return {name: environ.get(name) for name in DAEMON_VARIABLES}


@dataclass(frozen=True)
class EnvironmentDiff:
    next_job: dict[str, str | None]
    """Changed variables the running control plane can take now."""
    restart: dict[str, str | None]
    """Changed variables that need a restart of the control plane."""


def compare(
    started: Mapping[str, str | None] | None, here: Mapping[str, str | None]
) -> EnvironmentDiff:
    started = started or {}
    changed = {k: v for k, v in here.items() if started.get(k) != v}
    return EnvironmentDiff(
        next_job={k: v for k, v in changed.items() if k in NEXT_JOB_VARIABLES},
        restart={k: v for k, v in changed.items() if k not in NEXT_JOB_VARIABLES},
    )


def environment_section() -> str:
    """The GPULAYER_* table of docs/settings.md."""
    when = {
        "command": "each command",
        "next_job": "the next job (sent to the running local control plane)",
        "restart": "a restart of the control plane (the local one restarts by itself once no "
        "job is live)",
    }
    lines = [
        "## Environment variables",
        "",
        "| variable | takes effect on | meaning |",
        "| --- | --- | --- |",
    ]
    for variable in VARIABLES:
        lines.append(f"| `{variable.name}` | {when[variable.applies]} | {variable.meaning} |")
    return "\n".join(lines) + "\n"
