"""`gpulayer offers` for people: the control plane's listing as a table (scripts use --json).

Narrow on purpose, so 80 columns hold a row without cutting a name or a price: the GPU count,
model and memory share a column, a provider that is not enabled is starred (the footnote says
how to enable it), the currency goes into the price header when all rows share one, and on a
narrow terminal VCPU, RAM and then ZONE are left out before anything is cut. IDLE (machines free
now) and LIMIT (the longest a machine may be held) appear only when some listed provider says
them, as a Slurm partition does.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from rich.console import Console

from gpulayer.cli.fit import Column, print_fitted
from gpulayer.cloud.ranking import format_price
from gpulayer.hardware.gpus import nominal_memory_gb


def gpus_text(row: dict[str, Any], *, memory: bool = True) -> str:
    """ "1x A10G 24GB"; a slice of one GPU says which part: "1x 1/8 L4 2.79GB"."""
    if not row["gpu_count"]:
        return "-"
    part = row.get("gpu_slice")
    model = f"{Fraction(part).limit_denominator(64)} {row['gpu_name']}" if part else row["gpu_name"]
    if not memory:
        return f"{row['gpu_count']}x {model}"
    # The size the GPU is sold with (24GB for an A10G), as jobs ask for it.
    size = nominal_memory_gb(row["gpu_name"], row.get("gpu_memory_gb"))
    sized = f" {size:g}GB" if size else ""
    return f"{row['gpu_count']}x {model}{sized}"


def _zone(row: dict[str, Any]) -> str:
    if row.get("zone"):
        return str(row["zone"])
    # A catalog offer stands for its region; the zone is chosen at launch among these.
    zones: list[str] = list(row.get("zones") or ())
    if len(zones) == 1:
        return str(zones[0])
    return f"{len(zones)} zones" if zones else "-"


def _reads_a_queue(row: dict[str, Any]) -> bool:
    # A batch queue's offer (a Slurm partition) says both; a cloud's says neither.
    return row.get("idle_nodes") is not None or row.get("time_limit_seconds") is not None


def time_limit_text(seconds: int | None) -> str:
    """7200 -> ``2h``, 129600 -> ``1d12h``, 90 -> ``1m30s``; None -> ``none``."""
    if seconds is None:
        return "none"
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    return "".join(f"{value}{unit}" for value, unit in parts if value) or "0s"


def offers_table(listing: dict[str, Any]) -> None:
    rows = listing["offers"]
    console = Console(highlight=False)
    if not rows:
        console.print("no offers")
    else:
        currencies = {row.get("currency", "USD") for row in rows}
        single = currencies.pop() if len(currencies) == 1 else None
        # Submit rents spot only where the provider allows it; with none listed the column
        # would say "no" on every row.
        any_spot = any(row["spot"] for row in rows)
        any_queue = any(_reads_a_queue(row) for row in rows)
        columns = [
            Column("PROVIDER"),
            Column("REGION"),
            Column("ZONE", drop=1),
            Column("TYPE"),
            Column("GPUS"),
            Column("VCPU", drop=3, justify="right"),
            Column("RAM", drop=2, justify="right"),
            Column(f"{single}/H" if single else "PRICE/H", justify="right"),
        ]
        if any_queue:
            columns += [Column("IDLE", drop=4, justify="right"), Column("LIMIT", drop=5)]
        if any_spot:
            columns.append(Column("SPOT"))
        cells = []
        for row in rows:
            price = row.get("hourly_price")
            shown = "unknown" if price is None else format_price(price)
            if single is None and price is not None:
                shown += f" {row.get('currency', 'USD')}"
            line = [
                row["provider"] + ("" if row["enabled"] else "*"),
                row["region"],
                _zone(row),
                row["instance_type"],
                gpus_text(row),
                f"{row['cpu_cores']:g}",
                "-" if row.get("memory_gb") is None else f"{row['memory_gb']:g}",
                shown,
            ]
            if any_queue:
                if _reads_a_queue(row):
                    idle = row.get("idle_nodes")
                    line.append("?" if idle is None else str(idle))
                    line.append(time_limit_text(row.get("time_limit_seconds")))
                else:
                    line += ["-", "-"]
            if any_spot:
                line.append("yes" if row["spot"] else "no")
            cells.append(line)
        print_fitted(console, columns, cells)
    total = listing.get("total", len(rows))
    if total > len(rows):
        console.print(f"({total - len(rows)} more; --limit to see them)")
    if any(not row["enabled"] for row in rows):
        console.print("* not enabled: listed from its catalog; see the note below to enable it")
    for catalog in listing.get("catalogs", []):
        console.print(f"{catalog['provider']} catalog as of {catalog['as_of']}", style="dim")
