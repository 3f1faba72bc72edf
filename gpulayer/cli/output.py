"""Printing helpers shared by commands: JSON for scripts, rich tables for people."""

from __future__ import annotations

import json
from typing import Any

import typer


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=False, default=str))
