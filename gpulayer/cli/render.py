"""Rich rendering of jobs and workers for people (scripts use --json)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from gpulayer.cli.fit import Column, print_fitted
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
    columns = (
        Column("ID"),
        Column("NAME", prose=True, fold=True),
        Column("STATE"),
        Column("REASON", prose=True),
        Column("TARGET", drop=2),
        Column("EXIT", drop=1, justify="right"),
        Column("CREATED"),
    )
    print_fitted(_console(), columns, rows)


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
    if job.get("ports"):
        listed = ", ".join(str(p) for p in job["ports"])
        rows.append(("ports", f"{listed} (gpulayer attach {job['id']} forwards them here)"))
    for reason in job.get("waiting_for") or []:
        rows.append(("waiting for", reason))
    for report in _train_reports(job.get("result"))[-5:]:
        rows.append(("report", report))
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
        lines: list[tuple[str, ...]] = []
        for attempt in attempts:
            worker = attempt.get("worker_name") or "-"
            if attempt.get("worker_id"):
                worker = f"{worker} ({attempt['worker_id']})"
            number = str(attempt["number"])
            if any(a.get("node_rank") for a in attempts):
                number += f" node {attempt.get('node_rank', 0)}"
            lines.append(
                (
                    number,
                    _state(attempt["state"]),
                    attempt.get("reason") or "",
                    worker,
                    ",".join(str(g) for g in attempt.get("gpu_indices") or []) or "-",
                    _short_time(attempt.get("started_at")),
                    _short_time(attempt.get("finished_at")),
                )
            )
        columns = (
            Column("#", prose=True),
            Column("STATE"),
            Column("REASON", prose=True),
            # "name (id)" wraps between the two, so neither is cut.
            Column("WORKER", prose=True),
            Column("GPUS", prose=True, drop=1),
            Column("STARTED"),
            # The job's own finish time is in the panel above.
            Column("FINISHED", drop=2),
        )
        print_fitted(console, columns, lines, title="attempts")
        for attempt in attempts:
            if attempt.get("setup_seconds") is not None:
                took = _duration(attempt["setup_seconds"])
                console.print(f"attempt {attempt['number']}: setup took {took}")
    for instance in job.get("instances") or []:
        console.print(_phases_table(instance))
        last = last_step_line(instance)
        if last is not None:
            console.print(last, highlight=False)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{rest:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def last_step_line(instance: dict[str, Any]) -> str | None:
    """What the instance's last lifecycle step found, in one line."""
    last = instance.get("last_step")
    if not last:
        return None
    said = f": {last['note']}" if last.get("note") else ""
    return f"last step: {last['step']} {last['outcome']}{said}"


def _phases_table(instance: dict[str, Any]) -> Table:
    name = instance.get("instance_id") or instance["request_id"]
    state = instance.get("state_label") or instance["state"]
    title = f"instance {name} ({instance['provider']}, {state})"
    table = Table(box=None, header_style="bold", title=title, title_justify="left")
    for column in ("PHASE", "STARTED", "DURATION"):
        table.add_column(column)
    for phase in instance.get("phases") or []:
        ongoing = " (ongoing)" if phase["ended_at"] is None else ""
        table.add_row(
            phase["phase"],
            _short_time(phase["started_at"]),
            _duration(phase["seconds"]) + ongoing,
        )
    return table


def instances_table(instances: list[dict[str, Any]]) -> None:
    rows = []
    for item in instances:
        price = "-" if item["hourly_price"] is None else f"{item['hourly_price']:.4f}"
        cost = "-" if item["cost"] is None else f"{item['cost']:.4f} {item['currency']}"
        where = item.get("zone") or item.get("region") or "-"
        rows.append(
            (
                item["instance_id"] or item["request_id"],
                item["provider"],
                item.get("instance_type") or "-",
                where,
                item.get("state_label") or item["state"],
                _duration(item.get("age_in_state_seconds")),
                price,
                cost,
                item["job_id"] or "-",
                item.get("fleet") or "-",
            )
        )
    columns = (
        Column("INSTANCE"),
        Column("PROVIDER", drop=2),
        Column("TYPE"),
        # The zone names its region (us-east-1a); a provider without zones shows the region.
        Column("WHERE"),
        Column("STATE"),
        Column("IN STATE", prose=True, drop=3),
        Column("PRICE/H", drop=1, justify="right"),
        Column("COST", prose=True, drop=4, justify="right"),
        Column("JOB"),
        Column("FLEET", drop=5),
    )
    console = _console()
    if instances:
        print_fitted(console, columns, rows)
    else:
        console.print("no instances (--all shows ended ones)")


def _train_reports(result: Any) -> list[str]:
    """A Trainer run's rank-0 reports (its result carries them), one line each."""
    import json

    if not isinstance(result, dict) or "node_rank" not in result:
        return []
    metrics = result.get("metrics")
    if not isinstance(metrics, list):
        return []
    return [json.dumps(m, sort_keys=True)[:200] for m in metrics]


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


def _worker_state(worker: dict[str, Any]) -> str:
    """A ready worker that takes no job says why (``degraded: disk full``)."""
    degraded = worker.get("degraded")
    if worker["state"] == "ready" and degraded:
        return f"degraded: {degraded}"
    return str(worker["state"])


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
                _worker_state(worker),
                str(worker.get("running", 0)),
                _hardware(caps),
                str(caps.get("cpu_cores", "-")),
                "-" if memory is None else f"{memory:.1f}",
                f"{caps.get('os', '?')}/{caps.get('cpu_arch', '?')}",
                caps.get("python_version", "-"),
                caps.get("isolation") or "-",
                {True: "persist", False: "per attempt", None: "-"}[job_writes_persist(worker)],
                ", ".join(f"{k}={v}" for k, v in (worker.get("labels") or {}).items()),
            )
        )
    columns = (
        Column("ID"),
        Column("NAME", fold=True),
        Column("KIND"),
        Column("STATE"),
        Column("RUNNING", justify="right"),
        Column("HARDWARE", prose=True),
        Column("CPU", drop=4, justify="right"),
        Column("MEM GB", prose=True, drop=3, justify="right"),
        Column("OS/ARCH", drop=5),
        Column("PYTHON", drop=6),
        Column("ISOLATION", drop=2),
        Column("JOB WRITES", drop=2),
        Column("LABELS", prose=True, drop=1),
    )
    console = _console()
    print_fitted(console, columns, rows)
    for worker in workers:
        isolation = (worker.get("capabilities") or {}).get("isolation")
        if isolation == "none":
            console.print(f"warning: {unisolated_warning(worker['name'])}", style="yellow")
        elif isolation == "shared_uid":
            console.print(f"warning: {shared_uid_warning(worker['name'])}", style="yellow")


def job_writes_persist(worker: dict[str, Any]) -> bool | None:
    """Whether what a job writes outside its attempt's folder (its user's home, shared temp
    folders, and on a worker without --run-as the worker's own caches and files) can still be
    there for later jobs: only a uid per attempt, cleaned before reuse, rules that out. None:
    the worker does not say (the local control plane's own worker)."""
    isolation = (worker.get("capabilities") or {}).get("isolation")
    return None if isolation is None else isolation != "uid_per_attempt"


def unisolated_warning(name: str) -> str:
    return (
        f"worker {name} runs its jobs as its own user: they can read its credential and act "
        "as it, and what a job writes persists into later jobs (start it as root with "
        "--run-as-range)"
    )


def shared_uid_warning(name: str) -> str:
    return (
        f"worker {name} runs all its jobs as one user: they can reach each other's secrets and "
        "files, and what a job writes persists into later jobs (start it with --run-as-range)"
    )


def cost_table(ledger: dict[str, Any]) -> None:
    from gpulayer.cloud.ranking import format_price

    rows = [
        (
            # A fleet's machine no job took: its time is the fleet's.
            item["job_id"] or f"fleet {item.get('fleet')}",
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
    columns = (
        Column("JOB"),
        Column("PROVIDER", drop=1),
        Column("INSTANCE"),
        Column("STATE"),
        Column("PRICE/H", justify="right"),
        Column("LAUNCHED", drop=2),
        Column("ENDED", drop=1),
        Column("COST", justify="right"),
    )
    console = _console()
    print_fitted(console, columns, rows)
    totals = ", ".join(
        amount_text(amount, currency) for currency, amount in ledger["total"].items()
    )
    console.print(f"total: {totals or '0'}")


def token_table(tokens: list[dict[str, Any]]) -> None:
    rows = []
    for token in tokens:
        registered = token.get("registered") or 0
        cap = token.get("max_workers")
        workers = "" if token["kind"] != "join" else f"{registered}/{cap or '-'}"
        rows.append(
            (
                token["id"],
                token["kind"],
                token.get("name") or "",
                token["state"],
                workers,
                _short_time(token.get("expires_at")),
                _short_time(token.get("created_at")),
            )
        )
    columns = (
        Column("ID"),
        Column("KIND"),
        Column("NAME", fold=True),
        Column("STATE"),
        Column("WORKERS", drop=1),
        Column("EXPIRES"),
        Column("CREATED", drop=2),
    )
    print_fitted(_console(), columns, rows)


def secret_table(secrets: list[dict[str, Any]]) -> None:
    rows = [
        (s["name"], _short_time(s.get("updated_at")), _short_time(s.get("created_at")))
        for s in secrets
    ]
    columns = (Column("NAME", fold=True), Column("UPDATED"), Column("CREATED", drop=1))
    print_fitted(_console(), columns, rows)
