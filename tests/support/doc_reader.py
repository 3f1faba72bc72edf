"""A reader trying the manual's examples: a fresh HOME, a project folder, a real terminal.

Commands run through bash in the project folder, as typed, with the `gpulayer` this checkout
installed first on PATH; gpulayer's home is where a fresh user's is (~/.local/share/gpulayer), so
the first command starts the local control plane there, as it would for them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import Any, Union

from tests.support.daemon import stop_local_control_plane
from tests.support.doc_examples import Example

Substitute = Union[str, Callable[[str], str]]  # a callable gets the line as written
# Variables a developer's shell may carry that would point a reader elsewhere.
_FOREIGN = (
    "GPULAYER_HOME",
    "GPULAYER_SERVER",
    "GPULAYER_TOKEN",
    "GPULAYER_PROVIDERS_FILE",
    "XDG_DATA_HOME",
    "XDG_CONFIG_HOME",
    "BROWSER",
)


class Reader:
    def __init__(self, root: Path, env: Mapping[str, str] | None = None) -> None:
        self.home = root / "home"
        self.project = root / "project"
        self.home.mkdir(parents=True)
        self.project.mkdir(parents=True)
        base = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
        bin_dir = str(Path(sys.executable).parent)
        self.env = {
            **base,
            "HOME": str(self.home),
            "COLUMNS": "200",
            "PATH": f"{bin_dir}{os.pathsep}{base.get('PATH', '')}",
            "GPULAYER_IDLE_SECONDS": "300",
            **(env or {}),
        }
        self._logs: dict[int, Path] = {}
        self._spawned: list[subprocess.Popen[str]] = []

    @property
    def gpulayer_home(self) -> Path:
        return self.home / ".local" / "share" / "gpulayer"

    def write(self, files: Mapping[str, str]) -> None:
        for name, text in files.items():
            path = self.project / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    def sh(
        self, command: str, *, timeout: float = 120, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", command],
            cwd=self.project,
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def spawn(self, command: str, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
        """Start a line that keeps running; its output goes to files (a pipe nobody reads
        would stall a chatty server), read back with :meth:`output`."""
        logs = self.project.parent / f"background-{len(self._logs)}"
        with open(f"{logs}.out", "w") as out, open(f"{logs}.err", "w") as err:
            process = subprocess.Popen(
                ["bash", "-c", command],
                cwd=self.project,
                env=env or self.env,
                stdout=out,
                stderr=err,
                text=True,
                start_new_session=True,
            )
        self._logs[process.pid] = logs
        self._spawned.append(process)
        return process

    def output(self, process: subprocess.Popen[str]) -> tuple[str, str]:
        logs = self._logs[process.pid]
        return Path(f"{logs}.out").read_text(), Path(f"{logs}.err").read_text()

    def python(self, example: Example, *, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """A Python example saved as a script in the project folder and run as one."""
        script = self.project / f"{example.name.replace('-', '_')}.py"
        script.write_text(example.body + "\n")
        return self.sh(f"python {script.name}", timeout=timeout)

    def jobs(self, *flags: str) -> list[dict[str, Any]]:
        listed = self.sh("gpulayer ls --json -n 1000 " + " ".join(flags))
        assert listed.returncode == 0, listed.stderr
        rows: list[dict[str, Any]] = json.loads(listed.stdout)
        return rows

    def wait_for(self, what: str, check: Callable[[], Any], timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")

    def close(self) -> None:
        """End what this reader started: lines left running (each in a session of its own,
        ended as a group, the last started first), then the local control plane."""
        for process in reversed(self._spawned):
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if process.poll() is not None:
                    break
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=15)
        stop_local_control_plane(self.gpulayer_home)


class Run:
    """One example's command lines, as run: each written line maps to its completed process (or
    to the process left running in the background)."""

    def __init__(self) -> None:
        self.done: dict[str, subprocess.CompletedProcess[str]] = {}
        self.background: dict[str, subprocess.Popen[str]] = {}
        self.not_run: dict[str, str] = {}

    def __getitem__(self, written: str) -> subprocess.CompletedProcess[str]:
        return self.done[written]


def run_example(
    reader: Reader,
    example: Example,
    *,
    skip: Mapping[str, str] = {},
    subs: Mapping[str, Substitute] = {},
    background: Collection[str] = (),
    after: Mapping[str, Callable[[str, Run], None]] = {},
    machines: Mapping[str, Mapping[str, str]] = {},
    timeout: float = 120,
) -> Run:
    """Run each command line of a shell example in order.

    `skip` maps a command (or one `&&` part of one) to why it does not run here; `subs` replaces
    a placeholder word (JOB, server:8765) with the value this run has, computed when the line
    runs; `background` lines are started and left running; `after` calls a hook with a line
    and the run so far once the line ran (or started); `machines` runs a line in another machine's shell (that
    environment instead of the reader's). An `export` line sets the variables for the lines
    after it, as the reader's shell would.
    Every key of each table must match the example, so none outlives the text it was made for.
    """
    assert example.language == "bash", example
    lines = example.commands()
    _must_match(example, "skip", skip, [part for line in lines for part in _parts(line)])
    _must_match(example, "background", background, lines)
    _must_match(example, "after", after, lines)
    _must_match(example, "machines", machines, lines)
    unused = set(subs)
    run = Run()
    for written in lines:
        parts = []
        for part in _parts(written):
            if part in skip:
                run.not_run[part] = skip[part]
            else:
                parts.append(part)
        if not parts:
            continue
        command = " && ".join(parts)
        for word, value in sorted(subs.items(), key=lambda item: -len(item[0])):
            pattern = rf"(?<![\w.-]){re.escape(word)}(?![\w-])"
            if re.search(pattern, command):
                unused.discard(word)
                text = value(written) if callable(value) else value
                command = re.sub(pattern, text.replace("\\", r"\\"), command)
        if command.startswith("export "):  # the reader's shell keeps it for the lines after
            for assignment in shlex.split(command)[1:]:
                key, _, value = assignment.partition("=")
                reader.env[key] = value
        if written in background:
            run.background[written] = reader.spawn(command, env=machines.get(written))
        else:
            run.done[written] = reader.sh(command, timeout=timeout, env=machines.get(written))
        if written in after:
            after[written](written, run)
    assert not unused, f"{example.name}: placeholders no line has: {sorted(unused)}"
    return run


def _parts(line: str) -> list[str]:
    return [part.strip() for part in line.split(" && ")]


def _must_match(example: Example, table: str, keys: Iterable[str], lines: list[str]) -> None:
    stale = [key for key in keys if key not in lines]
    assert not stale, f"{example.name}: {table} names lines the example no longer has: {stale}"
