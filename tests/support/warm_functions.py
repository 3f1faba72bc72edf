"""Module-level functions the warm-interpreter tests run as function jobs: each tells which
process ran it and what it saw, so a test can tell items that shared a process apart."""

from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path
from typing import Any

CALLS = 0
"""Items this process has run: a module-level global that persists between items."""


def seen(item: int) -> dict[str, Any]:
    """What this item saw, after leaving traces that the next item must not see."""
    global CALLS
    CALLS += 1
    leaked = os.environ.get("WARM_LEAK")
    os.environ["WARM_LEAK"] = str(item)
    print(f"item {item} says hello")
    output = Path(os.environ["GPULAYER_OUTPUT_DIR"])
    (output / "item.txt").write_text(f"{item}\n")
    left_in_cwd = sorted(p.name for p in Path.cwd().glob("trace-*"))
    Path(f"trace-{item}").write_text("x")
    return {
        "item": item,
        "pid": os.getpid(),
        "calls": CALLS,
        "leaked": leaked,
        "left_in_cwd": left_in_cwd,
        "job": os.environ["GPULAYER_JOB_ID"],
        "cwd": os.getcwd(),
        "output_dir": str(output),
        "uid": os.getuid(),
        "index": os.environ.get("GPULAYER_ARRAY_INDEX"),
        "beside": _beside(),
    }


def _beside() -> str | None:
    """A file shipped beside this module, read through __file__ as libraries do."""
    path = Path(__file__).with_name("data.txt")
    return path.read_text() if path.exists() else None


def crash(item: int, how: str = "exit") -> dict[str, Any]:
    """Item 1 ends its whole process: os._exit, or a segmentation fault."""
    if item == 1:
        print(f"item {item} is about to crash", flush=True)
        if how == "segv":
            ctypes.string_at(0)
        os._exit(3)
    return {"item": item, "pid": os.getpid()}


def slow(item: int, marker: str = "") -> dict[str, Any]:
    """Item 1 sleeps until it is ended, writing its pid where the test looks for it."""
    if item == 1:
        Path(marker).write_text(str(os.getpid()))
        time.sleep(120)
    return {"item": item, "pid": os.getpid()}


def leaves(item: int, marker: str = "") -> dict[str, Any]:
    """Item 1 leaves a process running in a session of its own when it returns."""
    import subprocess

    if item == 1:
        child = subprocess.Popen(["sleep", "300"], start_new_session=True)
        Path(marker).write_text(str(child.pid))
    return {"item": item, "pid": os.getpid()}


def forge(item: int) -> dict[str, Any]:
    """Item 1 writes an answer for an item it is not into every socket it holds."""
    if item == 1:
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                    os.write(int(fd), b"999 0\n")
            except OSError:
                pass
    return {"item": item, "pid": os.getpid()}
