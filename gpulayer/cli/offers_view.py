"""`gpulayer offers` for people: the control plane's listing as a table (scripts use --json).

Narrow on purpose, so 80 columns hold a row without cutting a name or a price: the GPU count,
model and memory share a column, a provider that is not enabled is starred (the footnote says
how to enable it), and the currency goes into the price header when all rows share one.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from gpulayer.cloud.ranking import format_price
from gpulayer.hardware.gpus import nominal_memory_gb


def _gpus(row: dict[str, Any]) -> str:
    if not row["gpu_count"]:
        return "-"
    # The size the GPU is sold with (24GB for an A10G), as jobs ask for it.
    size = nominal_memory_gb(row["gpu_name"], row.get("gpu_memory_gb"))
    memory = f" {size:g}GB" if size else ""
    return f"{row['gpu_count']}x {row['gpu_name']}{memory}"


def _where(row: dict[str, Any]) -> str:
    return str(row.get("zone") or row["region"])


def offers_table(listing: dict[str, Any]) -> None:
    rows = listing["offers"]
    console = Console(highlight=False)
    if not rows:
        console.print("no offers")
    else:
        currencies = {row.get("currency", "USD") for row in rows}
        single = currencies.pop() if len(currencies) == 1 else None
        table = Table(box=None, header_style="bold", padding=(0, 1, 0, 0))
        table.add_column("PROVIDER", no_wrap=True)
        table.add_column("REGION", no_wrap=True)
        table.add_column("TYPE", no_wrap=True)
        table.add_column("GPUS", no_wrap=True)
        table.add_column("VCPU", justify="right")
        table.add_column("RAM", justify="right")
        table.add_column(f"{single}/H" if single else "PRICE/H", no_wrap=True, justify="right")
        table.add_column("SPOT")
        for row in rows:
            price = row.get("hourly_price")
            shown = "unknown" if price is None else format_price(price)
            if single is None and price is not None:
                shown += f" {row.get('currency', 'USD')}"
            table.add_row(
                row["provider"] + ("" if row["enabled"] else "*"),
                _where(row),
                row["instance_type"],
                _gpus(row),
                f"{row['cpu_cores']:g}",
                "-" if row.get("memory_gb") is None else f"{row['memory_gb']:g}",
                shown,
                "yes" if row["spot"] else "",
            )
        console.print(table)
    total = listing.get("total", len(rows))
    if total > len(rows):
        console.print(f"({total - len(rows)} more; --limit to see them)")
    if any(not row["enabled"] for row in rows):
        console.print("* not enabled: listed from its catalog; see the note below to enable it")
    for catalog in listing.get("catalogs", []):
        console.print(f"{catalog['provider']} catalog as of {catalog['as_of']}", style="dim")
