"""A warm interpreter: runs function-job items one at a time in one process, so the user's
module is imported once for many items (as Modal reuses a container's process).

Run as a script by the job's interpreter (standard library only, like function_shim, whose
call it makes per item): ``python warm_shim.py CHANNEL_FD SOURCE_DIR``. SOURCE_DIR goes first
on sys.path and stays there, so the module's ``__file__`` names a folder that lives as long
as the process. Each item comes over the channel (a Unix socket) as an 8-byte length, with
the item's stdout and stderr pipes passed along it, then a JSON body
``{"id": N, "env": {...}, "cwd": "..."}``: the process takes exactly that environment and
working folder, runs the call GPULAYER_FUNCTION_CALL names, writes its result as
function_shim does, lets go of the item's pipes and answers ``"N CODE\\n"``. End of file on
the channel ends the process.

What an item changes in the process itself (a module's globals, an import, a thread it
started) stays for the next item; its environment, working folder, temp folder and output
do not.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import tempfile

import function_shim  # beside this file; imported before the job's folder goes first

_HEADER = 8


def _read_exactly(channel: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = channel.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _next_item(channel: socket.socket) -> tuple[dict[str, object], list[int]]:
    header, fds, _, _ = socket.recv_fds(channel, _HEADER, 2)
    if not header:
        raise EOFError
    header += _read_exactly(channel, _HEADER - len(header))
    body = _read_exactly(channel, int.from_bytes(header, "little"))
    return json.loads(body), fds


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()


def _run_item(request: dict[str, object], out_fd: int, err_fd: int, home: str) -> int:
    _flush()
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.close(out_fd)
    os.close(err_fd)
    env = request["env"]
    assert isinstance(env, dict)
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # read TMPDIR again: it is the item's own
    try:
        os.chdir(str(request["cwd"]))
        return function_shim.run_call()
    finally:
        _flush()
        # The item's pipes reach end of file once whatever it left running lets go of them;
        # nothing this process prints between items goes to anyone's log.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.close(devnull)
        with contextlib.suppress(OSError):
            os.chdir(home)  # the item's folder is removed once it ends


def main() -> int:
    channel_fd, home = int(sys.argv[1]), sys.argv[2]
    os.set_inheritable(channel_fd, False)  # the items' own children never hold it
    channel = socket.socket(fileno=channel_fd)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.argv = [function_shim.__file__]  # what a function sees there in a process of its own
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        sys.path[0] = home
    else:
        sys.path.insert(0, home)
    while True:
        try:
            request, fds = _next_item(channel)
        except (EOFError, ConnectionError):
            return 0
        if len(fds) != 2:
            return 2  # not the worker speaking: stop rather than guess
        code = _run_item(request, fds[0], fds[1], home)
        channel.sendall(f"{request['id']} {code}\n".encode())


if __name__ == "__main__":
    sys.exit(main())
