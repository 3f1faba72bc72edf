"""Printing helpers shared by commands: JSON for scripts, rich tables for people."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import Any

import typer


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def print_json_items(items: Iterable[Any]) -> None:
    """A JSON array written item by item as they come, never held whole."""
    out = sys.stdout
    out.write("[")
    wrote = False
    for item in items:
        out.write(",\n  " if wrote else "\n  ")
        out.write(json.dumps(item, default=str))
        wrote = True
    out.write("\n]\n" if wrote else "]\n")
    out.flush()
