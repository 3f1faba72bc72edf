"""The gpulayer command line. Heavy modules are imported inside commands, never here.

A plain `gpulayer submit` runs without the typer application (see fast_submit); every other
command, and any submit it does not read exactly as typer would, goes through it."""

from __future__ import annotations

import sys
from typing import Any


def main() -> None:
    from gpulayer.cli.fast_submit import main as fast_submit

    if fast_submit(sys.argv[1:]):
        return
    from gpulayer.cli.app import main as full

    full()


def __getattr__(name: str) -> Any:
    if name == "app":
        from gpulayer.cli.app import app

        return app
    raise AttributeError(f"module 'gpulayer.cli' has no attribute {name!r}")


__all__ = ["app", "main"]
