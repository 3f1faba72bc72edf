"""Adding and removing a launch request's public key in an authorized_keys file on a host
(an ssh provider's host, a Slurm cluster's shared home), as shell commands run there.

The line carries the marker ``gpulayer-request:<request id>`` as its comment, so removal takes
out exactly that line (an exact match on the last field) and nothing the user put there.
"""

from __future__ import annotations

import shlex

from gpulayer.ssh.errors import InvalidHostKey
from gpulayer.ssh.hostkeys import parse_host_key

MARKER = "gpulayer-request:"


def authorized_key_marker(request_id: str) -> str:
    return f"{MARKER}{request_id}"


def authorized_key_line(public_key: str, request_id: str) -> str:
    """``type blob gpulayer-request:<id>``. Anything but a plain key line (options such as
    ``command=``, a corrupt blob) raises ValueError, so nothing else reaches the file."""
    try:
        key = parse_host_key(public_key)
    except InvalidHostKey as exc:
        raise ValueError(str(exc).replace("host key", "public key")) from None
    words = public_key.split()
    if words[0] != key.key_type:
        raise ValueError("the public key must start with its key type, without options")
    return f"{key.key_type} {key.blob} {authorized_key_marker(request_id)}"


def _path(path: str) -> str:
    # "~/" is the login user's home on the host, which only the host's shell knows.
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def _one_at_a_time(body: str) -> str:
    # Every edit reads the file and writes it back, and launches and teardowns on other
    # threads or controllers edit the same file at once (a cluster's shared home): without a
    # lock, two removals can each put back the line the other took out, leaving a job's key
    # behind. flock's lock ends with the shell however it ends, and every holder is a short
    # edit, so it waits without a limit of its own (busybox's flock has no -w either); a
    # host without flock(1) edits unlocked, as one launch at a time needs no lock.
    return (
        "{ if command -v flock >/dev/null 2>&1; then flock 9 || exit 75; fi; "
        f'{body}; }} 9>>"$f.gpulayer-lock"'
    )


def add_authorized_key_command(path: str, public_key: str, request_id: str) -> str:
    """Host command: append the key line unless the request's line is there already."""
    line = shlex.quote(authorized_key_line(public_key, request_id))
    mark = shlex.quote(authorized_key_marker(request_id))
    return (
        f"umask 077; f={_path(path)}; "
        'mkdir -p "$(dirname "$f")" && touch "$f" || exit 1; '
        + _one_at_a_time(
            f"if awk -v m={mark} '$NF == m {{ found = 1 }} END {{ exit !found }}' \"$f\"; "
            "then exit 0; fi; "
            # A file without a final newline would glue our line onto the user's last key.
            'if [ -s "$f" ] && [ -n "$(tail -c 1 "$f")" ]; then echo >>"$f"; fi; '
            f'printf "%s\\n" {line} >>"$f"'
        )
    )


def remove_authorized_key_command(path: str, request_id: str) -> str:
    """Host command: drop the request's line, keeping the file itself (owner, mode, inode)."""
    mark = shlex.quote(authorized_key_marker(request_id))
    return f'umask 077; f={_path(path)}; [ -f "$f" ] || exit 0; ' + _one_at_a_time(
        'tmp="$f.gpulayer-$$"; '
        f'awk -v m={mark} \'$NF != m\' "$f" >"$tmp" && cat "$tmp" >"$f"; '
        'status=$?; rm -f "$tmp"; exit $status'
    )
