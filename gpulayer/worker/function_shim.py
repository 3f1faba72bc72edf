"""Calls a function job's module:function in a process of its own and writes its JSON result.

Run as a script by the job's interpreter, which need not have gpulayer installed, so this
file uses the standard library only and imports nothing heavy before the job's code does.
The runner passes (GPULAYER_* is reserved for gpulayer, so jobs cannot collide with these):

  GPULAYER_FUNCTION_CALL    JSON file {"entrypoint": "module:function", "args": [...],
                            "kwargs": {...}}
  GPULAYER_FUNCTION_RESULT  where to write {"ok": true, "value": ...} or
                            {"ok": false, "error": "one line", "kind": "..."}
  GPULAYER_FUNCTION_RANKED  "1" under a distributed launcher: each rank writes
                            RESULT.<rank>, and the process group is set up before the call
  GPULAYER_COMM_BACKEND     the process group's backend (gloo or nccl) when ranked

On failure the traceback goes to stderr, which is the job's log, and the exit code is not 0.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import sys
import traceback
from typing import Any

_SUMMARY_LIMIT = 1000


def _summary(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    summary = f"{type(exc).__name__}: {line}" if line else type(exc).__name__
    return summary if len(summary) <= _SUMMARY_LIMIT else summary[: _SUMMARY_LIMIT - 3] + "..."


def _write(path: str, payload: dict[str, Any]) -> None:
    partial = path + ".partial"
    with open(partial, "w", encoding="utf-8") as f:
        f.write(json.dumps(payload, allow_nan=False))
    os.replace(partial, path)


def load(entrypoint: str) -> Any:
    module_name, _, attr_path = entrypoint.partition(":")
    target: Any = importlib.import_module(module_name)
    for attr in attr_path.split("."):
        target = getattr(target, attr)
    if not callable(target):
        raise TypeError(f"{entrypoint} is not callable")
    return target


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def call(entrypoint: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    value = load(entrypoint)(*args, **kwargs)
    if hasattr(value, "__await__"):
        import asyncio  # only async functions pay for it

        value = asyncio.run(_awaited(value))
    return value


def _print_user_traceback(exc: BaseException) -> None:
    # Drop this file's frames: the job's author wants their own code's traceback.
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)
    sys.stderr.flush()


class _ProcessGroup:
    """Sets up torch.distributed for a ranked call, when the function has not done so."""

    def __init__(self) -> None:
        self._created = False

    def __enter__(self) -> _ProcessGroup:
        import torch.distributed as dist

        backend = os.environ.get("GPULAYER_COMM_BACKEND", "gloo")
        if backend == "nccl":
            import torch

            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        if not dist.is_initialized():
            dist.init_process_group(backend=backend)
            self._created = True
        return self

    def __exit__(self, *exc_info: object) -> None:
        import torch.distributed as dist

        if self._created and dist.is_initialized():
            dist.destroy_process_group()


def _source_dir_first() -> None:
    # The job's source directory is the working directory and must win over this file's own
    # directory, which Python put first because this file was run as a script. The standard
    # modules above were imported before, so a job's json.py cannot replace ours.
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        sys.path[0] = os.getcwd()
    else:
        sys.path.insert(0, os.getcwd())


def _exit_before_native_teardown(code: int) -> None:
    """End a ranked call once its result is written. gloo's C++ objects can abort the process
    while the interpreter tears down (about 1 run in 10 on torch 2.13 CPU), which would turn
    a finished rank into a crashed one; Python's own exit handlers still run first."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def main() -> int:
    _source_dir_first()
    return run_call()


def run_call() -> int:
    """Call the function GPULAYER_FUNCTION_CALL names and write its result; the exit code
    its process should end with. A warm interpreter (see warm_shim) calls it once per item."""
    with open(os.environ["GPULAYER_FUNCTION_CALL"], encoding="utf-8") as f:
        request = json.load(f)
    result_path = os.environ["GPULAYER_FUNCTION_RESULT"]
    ranked = os.environ.get("GPULAYER_FUNCTION_RANKED") == "1"
    if ranked:
        result_path = f"{result_path}.{os.environ.get('RANK', '0')}"
    try:
        if ranked:
            with _ProcessGroup():
                value = call(request["entrypoint"], request["args"], request["kwargs"])
        else:
            value = call(request["entrypoint"], request["args"], request["kwargs"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        message = f"the function called sys.exit({exc.code!r}) instead of returning"
        print(message, file=sys.stderr, flush=True)
        _write(result_path, {"ok": False, "error": message, "kind": "function_error"})
        return code or 1
    except BaseException as exc:
        _print_user_traceback(exc)
        _write(result_path, {"ok": False, "error": _summary(exc), "kind": "function_error"})
        return 1
    try:
        _write(result_path, {"ok": True, "value": value})
    except (TypeError, ValueError, RecursionError) as exc:
        message = f"the return value is not JSON-serializable: {_summary(exc)}"
        print(message, file=sys.stderr, flush=True)
        _write(result_path, {"ok": False, "error": message, "kind": "result_not_json"})
        return 1
    return 0


if __name__ == "__main__":
    status = main()
    if os.environ.get("GPULAYER_FUNCTION_RANKED") == "1":
        _exit_before_native_teardown(status)
    sys.exit(status)
