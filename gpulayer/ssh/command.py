"""Turning a command and its environment into the one string an SSH exec request carries."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence

from gpulayer.ssh.errors import InvalidCommand

# fullmatch, ASCII: "$" would let a name end in a newline, which splits the exported line.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)


def render_command(command: str | Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """A shell command line for the remote login shell.

    A string is sent as written (it may use pipes and globs); a sequence is quoted word by
    word. The environment is exported in front rather than sent as SSH ``env`` requests,
    because sshd drops those unless its AcceptEnv lists each name.
    """
    if isinstance(command, str):
        line = command
    else:
        words = list(command)
        if not all(isinstance(w, str) for w in words):
            raise InvalidCommand("command words must all be strings")
        line = shlex.join(words)
    if not line.strip():
        raise InvalidCommand("command must not be empty")
    if "\0" in line:
        raise InvalidCommand("command must not contain a NUL byte")
    if not env:
        return line
    exports = []
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise InvalidCommand(f"env name {name!r} is not a valid variable name")
        if not isinstance(value, str) or "\0" in value:
            raise InvalidCommand(f"env value of {name} must be a string without NUL bytes")
        exports.append(f"{name}={shlex.quote(value)}")
    # Each exec request gets a fresh shell, so the exports end with the command.
    return f"export {' '.join(exports)}; {line}"
