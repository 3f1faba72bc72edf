"""How a command that ended in one of gpulayer's typed errors leaves: its lines on stderr and
the error's exit code. Shared by the typer application and the light submit path, which must
not import typer."""

from __future__ import annotations

import sys
from typing import NoReturn

from gpulayer.errors import GpulayerError, SpecError


def leave_with(exc: GpulayerError | KeyboardInterrupt) -> NoReturn:
    if isinstance(exc, KeyboardInterrupt):
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    lines = exc.lines if isinstance(exc, SpecError) else [str(exc)]
    for line in lines:
        print(f"error: {line}", file=sys.stderr)
    sys.exit(exc.exit_code)
