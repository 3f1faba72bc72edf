"""Rich rendering of jobs and workers for people (scripts use --json)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from gpulayer.cli.numbers import amount_text

_STATE_STYLE = {
    "queued": "yellow",
    "provisioning": "cyan",
    "running": "blue",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "magenta",
}


def _console() -> Console:
    return Console(highlight=False)


# Folded columns keep this much when the terminal allows (tiers tried in turn), so that a
# header or a state does not break mid-word while there is room.
_FOLD_TIERS = (9, 6, 4, 3)


def _table(
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    whole: Collection[str],
    width: int,
) -> Table:
    """A table whose ``whole`` columns (ids, prices) are never cut or wrapped on a narrow
    terminal: they keep their widest cell's width, and the other columns fold instead."""
    from rich.cells import cell_len
    from rich.text import Text

    widest = [
        max([cell_len(name), *(cell_len(Text.from_markup(row[i]).plain) for row in rows)])
        for i, name in enumerate(columns)
    ]
    padding = 2  # box=None keeps one space on each side of a cell
    left = width - sum(widest[i] + padding for i, name in enumerate(columns) if name in whole)
    folded = [i for i, name in enumerate(columns) if name not in whole]
    minimums: dict[int, int] = {}
    for tier in _FOLD_TIERS:
        wanted = {i: min(widest[i], tier) for i in folded}
        if sum(w + padding for w in wanted.values()) <= left:
            minimums = wanted
            break
    table = Table(box=None, header_style="bold")
    for index, name in enumerate(columns):
        if name in whole:
            table.add_column(name, no_wrap=True, min_width=widest[index])
        else:
            table.add_column(name, overflow="fold", min_width=minimums.get(index))
    for row in rows:
        table.add_row(*row)
    return table


def _state(state: str) -> str:
    return f"[{_STATE_STYLE.get(state, 'white')}]{state}[/]"


def _short_time(value: str | None) -> str:
    return value.replace("T", " ")[:19] if value else "-"


def jobs_table(jobs: list[dict[str, Any]]) -> None:
    rows = [
        (
            job["id"],
            job["name"],
            _state(job["state"]),
            job.get("reason") or "",
            job.get("target") or "",
            "" if job.get("exit_code") is None else str(job["exit_code"]),
            _short_time(job.get("created_at")),
        )
        for job in jobs
    ]
    columns = ("ID", "NAME", "STATE", "REASON", "TARGET", "EXIT", "CREATED")
    console = _console()
    console.print(_table(columns, rows, whole={"ID", "STATE", "CREATED"}, width=console.width))


def job_panel(job: dict[str, Any]) -> None:
    console = _console()
    rows = [
        ("id", job["id"]),
        ("name", job["name"]),
        ("state", _state(job["state"])),
        ("reason", job.get("reason") or "-"),
        ("message", job.get("message") or "-"),
        ("exit code", "-" if job.get("exit_code") is None else str(job["exit_code"])),
        ("target", job.get("target") or "-"),
        ("created", _short_time(job.get("created_at"))),
        ("started", _short_time(job.get("started_at"))),
        ("finished", _short_time(job.get("finished_at"))),
    ]
    job_cost = (job.get("cost") or {}).get("total") or {}
    if job_cost:
        rows.append(("cost", ", ".join(amount_text(v, k) for k, v in job_cost.items())))
    for reason in job.get("waiting_for") or []:
        rows.append(("waiting for", reason))
    if job.get("result") is not None:
        import json

        rows.append(("result", json.dumps(job["result"])[:500]))
    table = Table(box=None, show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
    attempts = job.get("attempts")
    if isinstance(attempts, list) and attempts:
        detail = Table(box=None, header_style="bold", title="attempts", title_justify="left")
        for column in ("#", "STATE", "REASON", "WORKER", "GPUS", "STARTED", "FINISHED"):
            detail.add_column(column)
        for attempt in attempts:
            worker = attempt.get("worker_name") or "-"
            if attempt.get("worker_id"):
                worker = f"{worker} ({attempt['worker_id']})"
            detail.add_row(
                str(attempt["number"]),
                _state(attempt["state"]),
                attempt.get("reason") or "",
                worker,
                ",".join(str(g) for g in attempt.get("gpu_indices") or []) or "-",
                _short_time(attempt.get("started_at")),
                _short_time(attempt.get("finished_at")),
            )
        console.print(detail)


def _hardware(caps: dict[str, Any]) -> str:
    gpus = caps.get("gpus") or []
    if not gpus:
        return caps.get("accelerator", "cpu")
    names: dict[str, int] = {}
    for gpu in gpus:
        label = gpu.get("name", "gpu")
        if gpu.get("memory_gb"):
            label += f" {gpu['memory_gb']:.0f}GB"
        names[label] = names.get(label, 0) + 1
    return ", ".join(f"{count}x {label}" for label, count in names.items())


def workers_table(workers: list[dict[str, Any]]) -> None:
    rows = []
    for worker in workers:
        caps = worker.get("capabilities") or {}
        memory = caps.get("memory_gb")
        rows.append(
            (
                worker["id"],
                worker["name"],
                worker["kind"],
                worker["state"],
                str(worker.get("running", 0)),
                _hardware(caps),
                str(caps.get("cpu_cores", "-")),
                "-" if memory is None else f"{memory:.1f}",
                f"{caps.get('os', '?')}/{caps.get('cpu_arch', '?')}",
                caps.get("python_version", "-"),
                ",".join(f"{k}={v}" for k, v in (worker.get("labels") or {}).items()),
            )
        )
    columns = (
        "ID",
        "NAME",
        "KIND",
        "STATE",
        "RUNNING",
        "HARDWARE",
        "CPU",
        "MEM GB",
        "OS/ARCH",
        "PYTHON",
        "LABELS",
    )
    console = _console()
    console.print(_table(columns, rows, whole={"ID"}, width=console.width))


def cost_table(ledger: dict[str, Any]) -> None:
    from gpulayer.cloud.ranking import format_price

    rows = [
        (
            item["job_id"],
            item["provider"],
            item["instance_id"] or item["request_id"],
            item["state"],
            "-" if item["hourly_price"] is None else format_price(item["hourly_price"]),
            _short_time(item["launched_at"]),
            _short_time(item["ended_at"]),
            "-" if item["cost"] is None else amount_text(item["cost"], item["currency"]),
        )
        for item in ledger["instances"]
    ]
    columns = ("JOB", "PROVIDER", "INSTANCE", "STATE", "PRICE/H", "LAUNCHED", "ENDED", "COST")
    console = _console()
    whole = {"JOB", "INSTANCE", "PRICE/H", "COST"}
    console.print(_table(columns, rows, whole=whole, width=console.width))
    totals = ", ".join(
        amount_text(amount, currency) for currency, amount in ledger["total"].items()
    )
    console.print(f"total: {totals or '0'}")


def token_table(tokens: list[dict[str, Any]]) -> None:
    table = Table(box=None, header_style="bold")
    for column, fold in (
        ("ID", False),
        ("KIND", False),
        ("NAME", True),
        ("STATE", False),
        ("WORKERS", False),
        ("EXPIRES", False),
        ("CREATED", False),
    ):
        table.add_column(column, no_wrap=not fold, overflow="fold")
    for token in tokens:
        registered = token.get("registered") or 0
        cap = token.get("max_workers")
        workers = "" if token["kind"] != "join" else f"{registered}/{cap or '-'}"
        table.add_row(
            token["id"],
            token["kind"],
            token.get("name") or "",
            token["state"],
            workers,
            _short_time(token.get("expires_at")),
            _short_time(token.get("created_at")),
        )
    _console().print(table)
