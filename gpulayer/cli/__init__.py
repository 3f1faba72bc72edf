"""The gpulayer command line. Heavy modules are imported inside commands, never here."""

from gpulayer.cli.app import app, main

__all__ = ["app", "main"]
