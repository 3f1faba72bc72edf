"""GPU discovery from vendor command-line tools, never from an ML framework.

Each probe takes a ``runner`` so the parsing can be exercised on recorded tool output. A tool
that is missing, fails or hangs means "no such GPUs here", never an exception: a worker must
still come up on a machine whose driver is broken. nvidia-smi's output is read by
:mod:`gpulayer.hardware.probe_parsing`, which a provider probing a host over SSH reads it with too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpulayer.hardware.probe_parsing import (
    NVIDIA_FIELDS,
    NVIDIA_FIELDS_LEGACY,
    nvidia_query_argv,
    parse_cuda_version,
    parse_nvidia_query,
    tool_value,
)
from gpulayer.spec.capabilities import GpuDevice

__all__ = [
    "COMMAND_TIMEOUT_SECONDS",
    "NOT_FOUND",
    "NVIDIA_HEADER_ARGV",
    "TIMED_OUT",
    "CommandResult",
    "GpuReport",
    "Runner",
    "parse_rocm_smi",
    "probe_apple",
    "probe_nvidia",
    "probe_rocm",
    "run_command",
]

COMMAND_TIMEOUT_SECONDS = 5.0
"""A wedged driver can make nvidia-smi hang for minutes; the probe must not."""


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0


Runner = Callable[[Sequence[str]], CommandResult]

# Shell conventions, so a result reads the same whether the tool was absent or timed out.
NOT_FOUND = 127
TIMED_OUT = 124


def run_command(argv: Sequence[str], timeout: float = COMMAND_TIMEOUT_SECONDS) -> CommandResult:
    try:
        # Its own session, so a timeout ends wrapper scripts' children too: an orphan holding
        # the pipes open would keep communicate() waiting past the timeout.
        proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as exc:
        return CommandResult(NOT_FOUND, "", str(exc))
    with proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_session(proc)
            proc.communicate()
            return CommandResult(TIMED_OUT, "", f"{argv[0]} timed out after {timeout:g} s")
    return CommandResult(proc.returncode, stdout, stderr)


def _kill_session(proc: subprocess.Popen[str]) -> None:
    killpg = getattr(os, "killpg", None)
    if killpg is None:  # Windows: no process groups to signal
        proc.kill()
        return
    with contextlib.suppress(ProcessLookupError):  # it ended on its own meanwhile
        killpg(proc.pid, signal.SIGKILL)


@dataclass(frozen=True)
class GpuReport:
    """What one vendor tool said: the devices, and the driver stack they run under."""

    gpus: list[GpuDevice] = field(default_factory=list)
    driver_version: str | None = None
    cuda_version: str | None = None


# --- NVIDIA -----------------------------------------------------------------------------------

NVIDIA_HEADER_ARGV: tuple[str, ...] = ("nvidia-smi",)


def _field_unknown(result: CommandResult, field_name: str) -> bool:
    said = result.stdout + result.stderr
    return f'"{field_name}"' in said and "not a valid field" in said


def probe_nvidia(runner: Runner, host_memory_gb: float | None = None) -> GpuReport:
    fields = NVIDIA_FIELDS
    result = runner(nvidia_query_argv(fields))
    if _field_unknown(result, "compute_cap"):
        fields = NVIDIA_FIELDS_LEGACY
        result = runner(nvidia_query_argv(fields))
    gpus, driver = parse_nvidia_query(result.stdout, fields, host_memory_gb)
    if not gpus:
        return GpuReport()
    banner = runner(list(NVIDIA_HEADER_ARGV))
    return GpuReport(gpus, driver, parse_cuda_version(banner.stdout))


# --- AMD ----------------------------------------------------------------------------------------

ROCM_SMI_ARGV: tuple[str, ...] = (
    "rocm-smi",
    "--showproductname",
    "--showmeminfo",
    "vram",
    "--showuniqueid",
    "--showdriverversion",
    "--json",
)
_CARD_RE = re.compile(r"^card(\d+)$")
_BYTES_PER_GIB = 1024**3


def _lookup(entry: dict[str, object], *keys: str) -> str | None:
    # Key spelling drifts between rocm-smi releases ("Card series" vs "Card Series").
    folded = {k.casefold(): v for k, v in entry.items()}
    for key in keys:
        value = folded.get(key.casefold())
        if value is not None:
            text = tool_value(str(value))
            if text is not None:
                return text
    return None


def _rocm_cards(data: dict[str, object]) -> dict[int, dict[str, object]]:
    cards: dict[int, dict[str, object]] = {}
    for key, value in data.items():
        match = _CARD_RE.match(key)
        if match and isinstance(value, dict):
            cards[int(match.group(1))] = value
        elif key == "system" and isinstance(value, dict):
            # Some releases nest the cards under "system".
            cards.update(_rocm_cards(value))
    return cards


def parse_rocm_smi(text: str) -> GpuReport:
    """Devices from ``rocm-smi --showproductname --showmeminfo vram ... --json`` output."""
    start = text.find("{")
    if start < 0:
        return GpuReport()
    try:
        data = json.loads(text[start:])
    except ValueError:
        return GpuReport()
    if not isinstance(data, dict):
        return GpuReport()
    gpus: list[GpuDevice] = []
    for index, card in sorted(_rocm_cards(data).items()):
        name = _lookup(card, "Card series", "Card model", "Device Name") or f"AMD GPU {index}"
        total = _lookup(card, "VRAM Total Memory (B)")
        memory_gb = round(int(total) / _BYTES_PER_GIB, 2) if total and total.isdigit() else None
        gpus.append(
            GpuDevice(
                index=index,
                name=name,
                memory_gb=memory_gb,
                memory_kind="dedicated",
                uuid=_lookup(card, "Unique ID"),
            )
        )
    return GpuReport(gpus, _rocm_driver(data) if gpus else None)


def _rocm_driver(data: dict[str, object]) -> str | None:
    # --showdriverversion answers under "system" in most releases, per card in some.
    holders = [data.get("system"), *_rocm_cards(data).values()]
    for holder in holders:
        if isinstance(holder, dict):
            driver = _lookup(holder, "Driver version")
            if driver is not None:
                return driver
    return None


def probe_rocm(runner: Runner) -> GpuReport:
    result = runner(list(ROCM_SMI_ARGV))
    if not result.ok:
        return GpuReport()
    return parse_rocm_smi(result.stdout)


# --- Apple --------------------------------------------------------------------------------------

APPLE_CHIP_ARGV: tuple[str, ...] = ("sysctl", "-n", "machdep.cpu.brand_string")


def probe_apple(runner: Runner, host_memory_gb: float | None) -> GpuReport:
    """The one Metal GPU of an Apple silicon Mac; it uses the host's memory."""
    result = runner(list(APPLE_CHIP_ARGV))
    name = result.stdout.strip() if result.ok and result.stdout.strip() else "Apple GPU"
    device = GpuDevice(index=0, name=name, memory_gb=host_memory_gb, memory_kind="unified")
    return GpuReport([device])
