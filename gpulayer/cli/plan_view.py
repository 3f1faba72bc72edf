"""`gpulayer plan` for people: the control plane's plan as lines and 80-column tables.

Modelled on `nomad job plan` and dstack's `apply` table: first the answer (where the job would
run), then each target tried in order with why it was taken or passed over.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.text import Text

from gpulayer.cli.fit import Column, fitted_table
from gpulayer.cli.offers_view import gpus_text
from gpulayer.cli.output import print_json
from gpulayer.cloud.ranking import format_price

_INDENT = 3


def _table(console: Console, columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> None:
    """A table under its step's title, indented, still within the terminal's width."""
    table = fitted_table(columns, rows, width=console.width - _INDENT)
    console.print(Padding(table, (0, 0, 0, _INDENT)))


def _indented(console: Console, text: str) -> None:
    """A line under its step's title; a long one wraps under itself, not at the margin."""
    console.print(Padding(Text(text), (0, 0, 0, _INDENT)))


def would_refuse(plan: dict[str, Any]) -> bool:
    """Whether submit would refuse the job (no target in its chain can take it)."""
    return plan["target"] is None


def show_plan(plan: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        print_json(plan)
        return
    console = Console(highlight=False)
    console.print(Text(plan["headline"]))
    for position, step in enumerate(plan["tried"], start=1):
        console.print()
        _step(console, position, step)
    console.print()
    console.print("[dim]nothing was created: no job, no upload, no instance[/]")


def _step(console: Console, position: int, step: dict[str, Any]) -> None:
    title = f"{position}. {step['role']} {step['target']}: {step['outcome']}"
    if step["why"]:
        title += f": {step['why']}"
    console.print(Text(title))
    if step["target"] == "cloud":
        _cloud(console, step.get("cloud"))
    else:
        _workers(console, step)


def _workers(console: Console, step: dict[str, Any]) -> None:
    rows = [
        (
            str(w["rank"]),
            escape(w["worker_id"]),
            escape(w.get("name") or "-"),
            "now" if w["fits_now"] else escape("when free: " + "; ".join(w["waits_for"])),
        )
        for w in step["workers"]
    ]
    if rows:
        columns = [
            Column("RANK", justify="right"),
            Column("WORKER"),
            Column("NAME", fold=True, drop=1),
            Column("FITS", prose=True),
        ]
        _table(console, columns, rows)
    else:
        _indented(console, f"no {step['target']} worker fits ({step['registered']} registered)")
    for reason, count in step["rejected"].items():
        noun = "worker" if count == 1 else "workers"
        _indented(console, f"{count} {noun} turned down: {reason}")


def _price(row: dict[str, Any]) -> str:
    price = row["hourly_price"]
    return "-" if price is None else format_price(price)


def _worst(row: dict[str, Any]) -> str:
    worst = row["worst_case_cost"]
    if row["hourly_price"] is None:
        return "-"
    return "unbounded" if worst is None else f"{worst:.2f}"


def _cloud(console: Console, cloud: dict[str, Any] | None) -> None:
    if cloud is None:
        _indented(console, "no cloud provider is installed or enabled")
        return
    arch = cloud.get("cpu_arch")
    if arch and cloud.get("cpu_arch_from") == "submitting machine":
        _indented(
            console,
            f"machines: {', '.join(arch)}, as the submitting machine (resources.cpu_arch "
            "lists the architectures to allow)",
        )
    for note in cloud.get("notes", []):
        _indented(console, f"note: {note}")
    offers = cloud["offers"]
    if offers:
        _indented(
            console,
            f"cheapest offers that fit ({len(offers)} of {cloud['fitting_total']}), "
            "in the order a launch tries them:",
        )
        _table(
            console,
            [
                Column("OFFER"),
                Column("GPUS", drop=1),
                Column("PRICE/H", justify="right"),
                Column("WORST CASE", justify="right"),
            ],
            [
                (
                    escape(o["label"]),
                    gpus_text(o, memory=False),
                    _price(o),
                    _worst(o),
                )
                for o in offers
            ],
        )
        _indented(console, f"first offer: {offers[0]['cost']}")
    cheaper = cloud["cheaper_rejected"]
    if cheaper:
        what = "cheaper offers turned down" if offers else "offers turned down, cheapest first"
        _indented(console, f"{what} ({len(cheaper)} of {cloud['cheaper_rejected_total']}):")
        _table(
            console,
            [Column("OFFER"), Column("PRICE/H", justify="right"), Column("WHY", prose=True)],
            [(escape(o["label"]), _price(o), escape(o["reason"])) for o in cheaper],
        )
    for reason, count in sorted(cloud["rejected"].items(), key=lambda item: (-item[1], item[0])):
        noun = "offer" if count == 1 else "offers"
        _indented(console, f"{count} {noun} turned down: {reason}")
