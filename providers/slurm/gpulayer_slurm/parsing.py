"""Reading what Slurm's commands print. Pure: text in, values out.

Slurm 22.05 (Debian 12's) has ``--json`` on few commands and its field widths truncate, so
gpulayer reads ``scontrol -o show node|partition``: one record per line, ``Key=value`` pairs
whose values may hold spaces (``OS=Linux 6.1.0 #1 SMP``, a drain ``Reason``), never a
``Word=`` of their own.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_KEY = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_]*)=")
_DURATION = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_GRES_ITEM = re.compile(r"^([A-Za-z0-9_]+)(?::([^:(]+))?(?::(\d+))?(?:\(.*\))?$")

# Node state flags that keep a node from running new jobs (scontrol prints STATE+FLAG+...).
_UNUSABLE = frozenset(
    {
        "DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "INVAL", "NOT_RESPONDING",
        "POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN", "REBOOT_REQUESTED", "REBOOT_ISSUED",
        "MAINTENANCE", "MAINT", "RESERVED", "FUTURE", "UNKNOWN",
    }
)  # fmt: skip


def parse_records(text: str) -> list[dict[str, str]]:
    """``scontrol -o show ...`` output: one dict per non-empty line."""
    return [parse_record(line) for line in text.splitlines() if line.strip()]


def parse_record(line: str) -> dict[str, str]:
    """One ``Key=value Key2=value with spaces`` line."""
    matches = list(_KEY.finditer(line))
    record: dict[str, str] = {}
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(line)
        record[match.group(1)] = line[match.end() : end].strip()
    return record


def parse_duration(text: str) -> int | None:
    """A Slurm time limit in seconds: ``UNLIMITED``/``INFINITE`` -> None; ``MM``, ``MM:SS``,
    ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``."""
    value = text.strip()
    if value.upper() in ("UNLIMITED", "INFINITE", "NONE", "N/A", ""):
        return None
    match = _DURATION.match(value)
    if match is None:
        raise ValueError(f"{text!r} is not a Slurm time limit")
    days, first, second, third = match.groups()
    numbers = [int(n) for n in (first, second, third) if n is not None]
    if days is not None:
        hours, minutes, seconds = [*numbers, 0, 0][:3]
        return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    if len(numbers) == 1:
        return numbers[0] * 60
    if len(numbers) == 2:
        return numbers[0] * 60 + numbers[1]
    return (numbers[0] * 60 + numbers[1]) * 60 + numbers[2]


def format_duration(seconds: int) -> str:
    """Seconds as sbatch's ``--time`` takes them: ``D-HH:MM:SS``, rounded up to a minute."""
    minutes = max(1, -(-seconds // 60))
    days, rest = divmod(minutes, 24 * 60)
    hours, minutes = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:00"


@dataclass(frozen=True)
class Gres:
    name: str
    type: str | None
    count: int


def parse_gres(text: str) -> list[Gres]:
    """``gpu:a100:4(S:0-1),gpu:2,shard:8`` -> each item; ``(null)`` and empty -> none."""
    value = text.strip()
    if value in ("", "(null)", "N/A"):
        return []
    found = []
    # Commas inside a socket list "(S:0,1)" are not separators.
    for item in re.split(r",(?![^(]*\))", value):
        match = _GRES_ITEM.match(item.strip())
        if match is None:
            raise ValueError(f"{item!r} is not a GRES")
        name, second, count = match.groups()
        if count is None and second is not None and second.isdigit():
            second, count = None, second
        found.append(Gres(name, second, int(count) if count is not None else 1))
    return found


@dataclass(frozen=True)
class NodeInfo:
    name: str
    partitions: tuple[str, ...]
    cpus: int
    memory_mb: int
    gres: tuple[Gres, ...]
    state: str
    cpu_arch: str | None
    address: str = ""
    """NodeAddr: where the node is reached (its name when Slurm has no other)."""

    @property
    def state_words(self) -> frozenset[str]:
        """``IDLE+DRAIN`` -> {IDLE, DRAIN}; sinfo's suffixes (``*`` not responding) read as
        the flag they stand for."""
        words = set()
        for word in self.state.upper().split("+"):
            if word.endswith("*"):
                words.add("NOT_RESPONDING")
            words.add(word.rstrip("*~#!%$@^-"))
        return frozenset(words)

    @property
    def usable(self) -> bool:
        """Could run a job now or later (not down, drained, failed or invalid)."""
        return not (self.state_words & _UNUSABLE)

    @property
    def idle(self) -> bool:
        # PLANNED: backfill holds the idle node for a job that waits.
        return self.usable and "IDLE" in self.state_words and "PLANNED" not in self.state_words

    def gpus(self) -> tuple[str | None, int]:
        """(GPU type, count) of the node's ``gpu`` GRES; mixed types: the most numerous."""
        by_type: dict[str | None, int] = {}
        for gres in self.gres:
            if gres.name == "gpu":
                by_type[gres.type] = by_type.get(gres.type, 0) + gres.count
        if not by_type:
            return None, 0
        gpu_type = max(by_type, key=lambda t: (by_type[t], t or ""))
        return gpu_type, by_type[gpu_type]


def parse_nodes(text: str) -> list[NodeInfo]:
    """``scontrol -o show node`` output."""
    nodes = []
    for record in parse_records(text):
        name = record.get("NodeName")
        if not name:
            continue
        partitions = tuple(p for p in record.get("Partitions", "").split(",") if p)
        nodes.append(
            NodeInfo(
                name=name,
                partitions=partitions,
                cpus=_int(record, "CPUTot", name),
                memory_mb=_int(record, "RealMemory", name),
                gres=tuple(parse_gres(record.get("Gres", ""))),
                state=record.get("State", "UNKNOWN"),
                cpu_arch=record.get("Arch") or None,
                address=record.get("NodeAddr") or name,
            )
        )
    return nodes


@dataclass(frozen=True)
class PartitionInfo:
    name: str
    up: bool
    max_time_seconds: int | None
    exclusive: bool = False
    """Jobs get whole nodes (``OverSubscribe=EXCLUSIVE``): a node is never shared."""


def parse_partitions(text: str) -> list[PartitionInfo]:
    """``scontrol -o show partition`` output."""
    found = []
    for record in parse_records(text):
        name = record.get("PartitionName")
        if not name:
            continue
        found.append(
            PartitionInfo(
                name=name,
                up=record.get("State", "UP").upper() == "UP",
                max_time_seconds=parse_duration(record.get("MaxTime", "UNLIMITED")),
                exclusive=record.get("OverSubscribe", "NO").upper().startswith("EXCLUSIVE"),
            )
        )
    return found


def _int(record: dict[str, str], key: str, node: str) -> int:
    try:
        return int(record[key])
    except (KeyError, ValueError):
        raise ValueError(f"node {node}: {key}={record.get(key)!r} is not a number") from None


@dataclass(frozen=True)
class QueuedJob:
    job_id: str
    name: str
    state: str
    reason: str
    nodes: tuple[str, ...]
    comment: str
    time_left: int | None = None
    """Seconds until Slurm ends it at its time limit (a running job); None: no limit, or
    not running."""


def parse_squeue(text: str) -> list[QueuedJob]:
    """``squeue -h -o '%i|%j|%T|%r|%N|%L|%k'`` output (the job name and comment are gpulayer's
    own, which never hold ``|``)."""
    found = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", 6)
        if len(parts) != 7:
            raise ValueError(f"{line!r} is not a squeue line of 7 fields")
        job_id, name, state, reason, nodes, left, comment = (p.strip() for p in parts)
        found += [
            QueuedJob(
                job_id=one,
                name=name,
                state=state,
                reason=reason,
                nodes=tuple(expand_hostlist(nodes)),
                comment=comment,
                time_left=_time_left(left),
            )
            for one in expand_array_job_ids(job_id)
        ]
    return found


_ARRAY_ID = re.compile(r"^(\d+)_\[([0-9,\-]+)(?:%\d+)?\]$")


def expand_array_job_ids(text: str) -> list[str]:
    """A job array's pending tasks as squeue may show them on one line (``12_[0-2%2]``,
    ``12_[1,4-5]``) -> each task's id (``12_0 12_1 12_2``); any other id as it is
    (``12``, a task's ``12_3``)."""
    match = _ARRAY_ID.match(text.strip())
    if match is None:
        return [text.strip()]
    job, ranges = match.groups()
    tasks: list[int] = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        tasks += range(int(low), int(high or low) + 1)
    return [f"{job}_{task}" for task in tasks]


def array_spec(tasks: Sequence[int], limit: int | None = None) -> str:
    """sbatch's ``--array`` value for ``tasks``: runs of indices as ranges, then ``%limit``
    (``[0, 1, 2], 2`` -> ``0-2%2``; ``[1, 3, 4]`` -> ``1,3-4``)."""
    ordered = sorted(set(tasks))
    if not ordered:
        raise ValueError("an array has at least one task")
    runs: list[list[int]] = []
    for task in ordered:
        if runs and task == runs[-1][1] + 1:
            runs[-1][1] = task
        else:
            runs.append([task, task])
    text = ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
    return f"{text}%{limit}" if limit else text


def _time_left(text: str) -> int | None:
    # squeue says NOT_SET or INVALID for jobs without one (pending, ended).
    try:
        return parse_duration(text)
    except ValueError:
        return None


def expand_hostlist(text: str) -> list[str]:
    """``gpu[1-2,4],cpu1`` -> ``gpu1 gpu2 gpu4 cpu1``; zero-padding kept (``n[01-02]``)."""
    value = text.strip()
    if value in ("", "(null)", "n/a"):
        return []
    names: list[str] = []
    for item in re.split(r",(?![^\[]*\])", value):
        match = re.match(r"^([^\[]*)\[([^\]]+)\](.*)$", item)
        if match is None:
            names.append(item)
            continue
        prefix, ranges, suffix = match.groups()
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            width = len(low)
            for number in range(int(low), int(high or low) + 1):
                names.append(f"{prefix}{number:0{width}d}{suffix}")
    return names
