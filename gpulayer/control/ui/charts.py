"""Pictures drawn on the server as SVG: stacked daily bars, and a job's timeline as one bar.

Pure functions from numbers to markup; no chart library reaches the browser. Colours are SVG
presentation attributes rather than style attributes, so a strict CSP (no inline style) holds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone

from markupsafe import Markup, escape

PALETTE = ("#3b6fd8", "#e0803a", "#3aa57a", "#b5479b", "#c9b037", "#5bb3c9", "#8a8a8a")
PHASE_COLOURS = {
    "queued": "#b8b8b8",
    "provisioning": "#e0803a",
    "setup": "#2a9d8f",
    "running": "#3b6fd8",
    "teardown": "#b5479b",
}


@dataclass(frozen=True)
class Interval:
    """Something that ran from start to end, accruing `rate` per hour, counted under `key`."""

    key: str
    start: float
    end: float
    rate: float


def day_start(day: date) -> float:
    return datetime(day.year, day.month, day.day, tzinfo=timezone.utc).timestamp()


def daily_totals(
    intervals: Iterable[Interval], *, today: date, days: int = 30
) -> tuple[list[date], dict[str, list[float]]]:
    """Per key, the amount accrued on each UTC day of the `days` ending today."""
    first = today - timedelta(days=days - 1)
    axis = [first + timedelta(days=i) for i in range(days)]
    starts = [day_start(d) for d in axis] + [day_start(today + timedelta(days=1))]
    series: dict[str, list[float]] = {}
    for item in intervals:
        if item.end <= item.start or item.rate <= 0:
            continue
        for i in range(days):
            overlap = min(item.end, starts[i + 1]) - max(item.start, starts[i])
            if overlap > 0:
                series.setdefault(item.key, [0.0] * days)[i] += item.rate * overlap / 3600.0
    return axis, dict(sorted(series.items()))


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is at least value."""
    if value <= 0:
        return 1.0
    base = 10.0 ** math.floor(math.log10(value))
    return next(step * base for step in (1, 2, 2.5, 5, 10) if step * base >= value)


def daily_bars_svg(
    axis: Sequence[date], series: dict[str, list[float]], *, title: str, unit: str
) -> Markup:
    """Stacked bars, one per day, one colour per key, with a legend and the scale's top."""
    width, height, left, bottom, top = 640, 220, 52, 28, 24
    plot_w, plot_h = width - left - 12, height - top - bottom
    totals = [sum(values[i] for values in series.values()) for i in range(len(axis))]
    ceiling = _nice_ceiling(max(totals, default=0.0))
    slot = plot_w / max(1, len(axis))
    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#999"/>',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" '
        'stroke="#999"/>',
        f'<text x="{left - 4}" y="{top + 4}" text-anchor="end" font-size="10" fill="#555">'
        f"{escape(_amount(ceiling))}</text>",
        f'<text x="{left - 4}" y="{top + 16}" text-anchor="end" font-size="10" fill="#555">'
        f"{escape(unit)}</text>",
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end" font-size="10" '
        'fill="#555">0</text>',
    ]
    for i, day in enumerate(axis):
        x = left + i * slot + 1
        y = float(top + plot_h)
        for k, (key, values) in enumerate(series.items()):
            value = values[i]
            if value <= 0:
                continue
            bar_h = plot_h * value / ceiling
            y -= bar_h
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(1.0, slot - 2):.1f}" '
                f'height="{bar_h:.1f}" fill="{PALETTE[k % len(PALETTE)]}">'
                f"<title>{escape(day.isoformat())} {escape(key)}: "
                f"{escape(_amount(value))} {escape(unit)}</title></rect>"
            )
        if (i % 7 == 0 and i < len(axis) - 4) or i == len(axis) - 1:
            parts.append(
                f'<text x="{x + slot / 2:.1f}" y="{height - 10}" text-anchor="middle" '
                f'font-size="10" fill="#555">{escape(day.strftime("%m-%d"))}</text>'
            )
    legend_x = left
    for k, key in enumerate(series):
        parts.append(
            f'<rect x="{legend_x}" y="6" width="10" height="10" '
            f'fill="{PALETTE[k % len(PALETTE)]}"/>'
            f'<text x="{legend_x + 14}" y="15" font-size="11" fill="#333">{escape(key)}</text>'
        )
        legend_x += 24 + 7 * len(key)
    if not series:
        parts.append(
            f'<text x="{left + plot_w / 2}" y="{top + plot_h / 2}" text-anchor="middle" '
            'font-size="12" fill="#777">nothing in the last 30 days</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def timeline_svg(segments: Sequence[tuple[str, float, float]]) -> Markup:
    """One bar from the first segment's start to the last one's end, a colour per phase."""
    width, height = 640, 34
    if not segments:
        return Markup("")
    begin = min(s[1] for s in segments)
    end = max(s[2] for s in segments)
    span = max(end - begin, 1e-6)
    parts = [
        f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}"'
        ' role="img" aria-label="timeline">'
    ]
    for phase, start, stop in segments:
        x = width * (start - begin) / span
        w = max(1.0, width * (stop - start) / span)
        colour = PHASE_COLOURS.get(phase, PALETTE[-1])
        parts.append(
            f'<rect class="phase phase-{escape(phase)}" x="{x:.1f}" y="2" width="{w:.1f}" '
            f'height="18" fill="{colour}"><title>{escape(phase)}: '
            f"{escape(_duration(stop - start))}</title></rect>"
        )
    x = 0
    for phase, colour in PHASE_COLOURS.items():
        if any(s[0] == phase for s in segments):
            parts.append(
                f'<rect x="{x}" y="24" width="8" height="8" fill="{colour}"/>'
                f'<text x="{x + 11}" y="32" font-size="9" fill="#333">{phase}</text>'
            )
            x += 20 + 6 * len(phase)
    parts.append("</svg>")
    return Markup("".join(parts))


def _amount(value: float) -> str:
    return f"{value:.2f}" if value < 100 else f"{value:,.0f}"


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
