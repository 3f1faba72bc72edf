"""Accrued costs as people read them: never rounded to zero, never a wall of digits.

Prices are facts and keep every digit they were published with (gpulayer.cloud.ranking's
format_price); a cost is price times elapsed time, whose float tail means nothing.
"""

from __future__ import annotations

import math

_SIGNIFICANT = 3


def amount_text(value: float | None, currency: str | None = None) -> str:
    """``21.96``, ``0.5264``, ``0.00001``: two to four decimals, and at least three significant
    digits for amounts under a cent, so a spot price of 1e-05 does not read as 0.0000."""
    if value is None:
        return "-"
    if value == 0 or not math.isfinite(value):
        text = f"{value:g}"
    elif abs(value) >= 0.01:
        text = _trim(f"{value:.4f}", keep=2)
    else:
        decimals = min(15, _SIGNIFICANT - 1 - math.floor(math.log10(abs(value))))
        text = _trim(f"{value:.{decimals}f}", keep=0)
    return f"{text} {currency}" if currency else text


def _trim(text: str, *, keep: int) -> str:
    whole, _, decimals = text.partition(".")
    decimals = decimals.rstrip("0")
    decimals = decimals.ljust(keep, "0")
    return f"{whole}.{decimals}" if decimals else whole
