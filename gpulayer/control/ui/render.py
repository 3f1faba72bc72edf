"""Jinja2 templates (package data) with the filters the pages share."""

from __future__ import annotations

import functools
import time
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from gpulayer.control.views import iso


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m"
    if seconds < 86400:
        return f"{seconds // 3600:.0f}h{(seconds % 3600) // 60:02.0f}m"
    return f"{seconds // 86400:.0f}d{(seconds % 86400) // 3600:.0f}h"


def money(totals: Any, currency: str = "USD") -> str:
    """A cost: a number with its currency, or a currency -> amount mapping."""
    if totals is None:
        return "-"
    if isinstance(totals, (int, float)):
        return f"{totals:.4f} {currency}"
    if not totals:
        return "-"
    return ", ".join(f"{amount:.4f} {cur}" for cur, amount in sorted(totals.items()))


def since(ts: float | None) -> str:
    return "-" if ts is None else age(time.time() - ts)


@functools.lru_cache(maxsize=1)
def environment() -> Environment:
    env = Environment(
        loader=PackageLoader("gpulayer.control.ui", "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(age=age, money=money, iso=iso, since=since)
    return env


def render(name: str, **context: Any) -> str:
    return environment().get_template(name).render(**context)
