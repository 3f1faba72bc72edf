"""Module-level functions the SDK tests run as function jobs."""

from __future__ import annotations


def scale(value: int, factor: int = 1) -> int:
    return value * factor
