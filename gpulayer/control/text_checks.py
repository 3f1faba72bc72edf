"""Text no store can hold, found before it reaches one, and repaired where it already did.

JSON can carry a lone surrogate (``"\\ud800"``) that no UTF-8 encoder accepts, and a NUL that
PostgreSQL refuses in text; either would fail deep in a request, or later on every read of the
row. Pure functions.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")
_NUL = "\x00"


def text_problem(text: str) -> str | None:
    """Why a string cannot be stored, or None when it can."""
    if _SURROGATE.search(text):
        return "holds a lone surrogate, which is not text (invalid UTF-8)"
    if _NUL in text:
        return "holds a NUL character"
    return None


def unsafe_text(value: Any, where: str = "") -> list[str]:
    """One line per string (key or value) in ``value`` that cannot be stored, naming its
    path the way spec errors do (``labels.team``, ``workload.command.1``)."""
    if _plainly_storable(value):
        return []
    problems: list[str] = []
    _walk(value, where, problems)
    return problems


def _plainly_storable(value: Any) -> bool:
    """Whether no string in ``value`` can hold a problem, judged on its JSON text at once (in
    C, where the walk below costs a call per string: a list submit checks thousands of specs).
    A NUL is written there as an escape, so a text that merely spells one (or anything not
    JSON) goes to the walk, which judges each string."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return False
    return "\\u0000" not in text and not _SURROGATE.search(text)


def _walk(value: Any, where: str, problems: list[str]) -> None:
    if isinstance(value, str):
        why = text_problem(value)
        if why:
            problems.append(f"{where or 'value'}: {why}")
    elif isinstance(value, dict):
        for key, item in value.items():
            key_text = str(key)
            why = text_problem(key_text)
            if why:
                problems.append(f"{where or 'value'}: a key {why}")
                continue
            _walk(item, f"{where}.{key_text}" if where else key_text, problems)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _walk(item, f"{where}.{index}" if where else str(index), problems)


def repair_text(text: str) -> str:
    """A storable copy: lone surrogates and NULs become U+FFFD."""
    return _SURROGATE.sub("\ufffd", text).replace(_NUL, "\ufffd")


def repaired(value: Any) -> Any:
    """``value`` with every string repaired and every non-finite float as None: what any JSON
    encoder and any reader accepts."""
    if isinstance(value, str):
        return repair_text(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {repair_text(str(k)): repaired(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [repaired(v) for v in value]
    return value
