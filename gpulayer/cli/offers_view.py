"""`gpulayer offers` for people: the control plane's listing as a table (scripts use --json)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def format_price(price: float | None, currency: str) -> str:
    from gpulayer.cloud.ranking import format_price as significant

    return "unknown" if price is None else f"{significant(price)} {currency}"


def _where(row: dict[str, Any]) -> str:
    if row.get("zone"):
        return f"{row['region']}/{row['zone']}"
    zones = row.get("zones") or []
    return f"{row['region']} ({len(zones)} zones)" if zones else row["region"]


def offers_table(listing: dict[str, Any]) -> None:
    rows = listing["offers"]
    table = Table(box=None, header_style="bold")
    # Names and prices are never cut: other columns wrap first.
    table.add_column("PROVIDER", no_wrap=True)
    table.add_column("REGION/ZONE", overflow="fold")
    table.add_column("TYPE", no_wrap=True)
    for column in ("GPUS", "GPU MEM", "VCPUS", "RAM GB", "ARCH"):
        table.add_column(column, overflow="fold")
    table.add_column("PRICE/H", no_wrap=True, justify="right")
    table.add_column("SPOT")
    table.add_column("ENABLED", overflow="fold")
    for row in rows:
        gpus = f"{row['gpu_count']}x {row['gpu_name']}" if row["gpu_count"] else "-"
        memory = f"{row['gpu_memory_gb']:g} GB" if row.get("gpu_memory_gb") else "-"
        enabled = "yes" if row["enabled"] else "no"
        if row["enabled"] and row.get("source") == "catalog":
            enabled = "yes (catalog)"
        table.add_row(
            row["provider"],
            _where(row),
            row["instance_type"],
            gpus,
            memory,
            f"{row['cpu_cores']:g}",
            "-" if row.get("memory_gb") is None else f"{row['memory_gb']:g}",
            row.get("cpu_arch", "-"),
            format_price(row.get("hourly_price"), row.get("currency", "USD")),
            "yes" if row["spot"] else "",
            enabled,
        )
    console = Console(highlight=False)
    if rows:
        console.print(table)
    else:
        console.print("no offers")
    total = listing.get("total", len(rows))
    if total > len(rows):
        console.print(f"({total - len(rows)} more; --limit to see them)")
    for catalog in listing.get("catalogs", []):
        console.print(
            f"{catalog['provider']} catalog as of {catalog['as_of']} ({catalog['source']})",
            style="dim",
        )
